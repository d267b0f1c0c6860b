"""Compute per job (`resources`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from atlas.config.base import Strict


class ResourcesConfig(Strict):
    """Compute the jobs ask for; profiles map these to SLURM or Kubernetes."""

    device: Literal["cpu", "cuda"] = Field(default="cpu", description="Where tensors live.")
    gpus: int = Field(default=0, ge=0, description="GPUs per training job (`resources: gpu=N`).")
    threads: int | None = Field(
        default=None,
        ge=1,
        description="Threads of each model job (Snakemake's `threads`, torch's OMP_NUM_THREADS); "
        "null: every core, one such job at a time. With 1, Snakemake runs as many jobs side by side "
        "as it has cores. Scheduling only: not in any stage's config slice, so changing it reruns "
        "nothing.",
    )
    gpu_memory_gb: dict[Literal["training", "rollouts", "checks"], int] | None = Field(
        default=None,
        description="GPU memory (GiB) each kind of GPU job holds at most: training (train, "
        "dose_step), rollouts (smoke, boundary, validation), checks. Set, each such job claims its "
        "amount as the Snakemake resource `gpu_mem_gb` and cannot allocate past it (torch's "
        "per-process memory fraction; the rollout pool sizes itself within it), so `--resources "
        "gpu_mem_gb=<the GPU's GiB>` runs side by side on one GPU the jobs that fit. null: no "
        "claim. Scheduling only: not in any stage's config slice.",
    )

    ranks: int | None = Field(
        default=None,
        ge=1,
        description="Data-parallel ranks of each training job (torchrun processes, each rolling out "
        "its share of a step's questions, then one synced update). null: one per GPU on cuda "
        "(`gpus`), one process on cpu; on cpu a number runs that many gloo ranks. On cuda it must "
        "equal `gpus`: one rank per GPU.",
    )

    @property
    def world_size(self) -> int:
        """The training job's rank count (1: a plain process, no torchrun)."""
        return self.ranks or max(1, self.gpus)

    @model_validator(mode="after")
    def _gpus_need_cuda(self) -> ResourcesConfig:
        if self.gpus > 0 and self.device != "cuda":
            raise ValueError("gpus > 0 needs device: cuda")
        if self.device == "cuda" and self.gpus == 0:
            raise ValueError("device: cuda needs gpus >= 1")
        if self.device == "cuda" and self.ranks is not None and self.ranks != self.gpus:
            raise ValueError(f"ranks {self.ranks} with gpus {self.gpus}: on cuda each rank has one GPU")
        if self.gpu_memory_gb is not None:
            if self.device != "cuda":
                raise ValueError("gpu_memory_gb needs device: cuda")
            missing = {"training", "rollouts", "checks"} - set(self.gpu_memory_gb)
            if missing or min(self.gpu_memory_gb.values()) < 1:
                raise ValueError(
                    f"gpu_memory_gb: give training, rollouts and checks at least 1 GiB each "
                    f"(got {self.gpu_memory_gb})"
                )
        return self

    def gpu_mem_gb(self, kind: str) -> int:
        """The Snakemake resource `gpu_mem_gb` a job of `kind` claims (0: none)."""
        return 0 if self.gpu_memory_gb is None else self.gpu_memory_gb[kind]
