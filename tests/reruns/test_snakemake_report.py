"""Snakemake's own surfaces of the workflow: `snakemake --report`, rendered in headless Chromium,
and the `.test/` configs that CI plans and lints.

The report test builds `--report report25.html` on a finished pipeline run, opens it in Chromium
(Debian's `chromium`), lets the report's own app show every result, and checks that the four
figures are drawn and that every figure's and table's caption is on the rendered page. The
screenshot it takes is kept under pytest's tmp path (the path is printed).
Under CI (CI=true) a missing Chromium fails the test; elsewhere it skips.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from atlas.report.tables import TABLES
from conftest import REPO, copy_pipeline, copy_workflow, run_snakemake

FIGURES = ("call_advantage", "perf_stack", "step_metrics", "validation_curves")
STAGES = {"Training", "Validation", "Performance"}
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",  # root in a container
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)

# Drives the report's own app the way a reader clicks through it: each result's panel (its
# caption), each figure in the viewer, the run statistics. What was rendered goes into
# <pre id="atlas-probe"> for --dump-dom to carry out.
PROBE = """
<script>
window.addEventListener("load", async () => {
  const tick = () => new Promise(resolve => setTimeout(resolve, 100));
  const seen = [];
  await tick();
  const start = document.body.innerText;
  for (const path of Object.keys(results).sort()) {
    app.showResultInfo(path);
    await tick();
    const item = { path: path, text: document.body.innerText, image: null };
    if (results[path].mime_type === "image/png") {
      app.setView({ content: "img", contentPath: results[path].data_uri, resultPath: path });
      await tick();
      const img = document.querySelector("img[src^='data:image/png']");
      item.image = img ? [img.naturalWidth, img.naturalHeight] : null;
    }
    seen.push(item);
  }
  app.setView({ content: "stats" });
  await tick();
  await tick();
  const charts = {};
  for (const id of ["runtimes", "timeline"]) {
    const chart = document.querySelector(`#${id} canvas, #${id} svg`);
    charts[id] = chart ? [chart.clientWidth, chart.clientHeight] : null;
  }
  const probe = document.createElement("pre");
  probe.id = "atlas-probe";
  probe.textContent = JSON.stringify({ start: start, results: seen, charts: charts });
  document.body.appendChild(probe);
});
</script>
"""

# The page a reader sees after picking the validation-curve figure: the screenshot.
SHOW_FIGURE = """
<script>
window.addEventListener("load", () => setTimeout(() => {
  const path = Object.keys(results).find(p => p.endsWith("figures/validation_curves.png"));
  app.showResultInfo(path);
  setTimeout(() => app.setView({ content: "img", contentPath: results[path].data_uri, resultPath: path }), 100);
}, 100));
</script>
"""


def mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def _chromium() -> str:
    exe = shutil.which("chromium")
    if exe is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the report test must run in CI: apt-get install -y chromium")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    return exe


def chromium(exe: str, page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            exe,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            "--virtual-time-budget=20000",
            *args,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )


def with_script(report: Path, script: str, dest: Path) -> Path:
    html = report.read_text(encoding="utf-8")
    end = html.rindex("</body>")  # the page's own, after the bundled scripts
    dest.write_text(html[:end] + script + html[end:], encoding="utf-8")
    return dest


def captions() -> dict[str, str]:
    """results/report25/<figures|tables>/<name> -> its caption text, from report/caption.rst."""
    text = (REPO / "report" / "caption.rst").read_text(encoding="utf-8")
    out = {}
    for kind, ext in (("figures", "png"), ("tables", "csv")):
        block = re.search(r"set " + kind + r" = \{(.*?)\} -%\}", text, re.S).group(1)
        for name, caption in re.findall(r'"(\w+)": "([^"]+)"', block):
            out[f"results/report25/{kind}/{name}.{ext}"] = caption
    return out


@pytest.fixture(scope="module")
def report_html(pipeline, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("report")
    wf = copy_pipeline(pipeline, tmp / "wf")
    shutil.copytree(REPO / "report", wf / "report", dirs_exist_ok=True)
    out = tmp / "report25.html"
    run_snakemake(wf, "--report", str(out), timeout=600)
    return out


def test_the_captions_cover_every_figure_and_table():
    assert sorted(captions()) == sorted(
        [f"results/report25/figures/{f}.png" for f in FIGURES]
        + [f"results/report25/tables/{t}.csv" for t in TABLES]
    )


def test_report_shows_figures_tables_and_statistics_in_chromium(report_html, tmp_path):
    exe = _chromium()
    html = report_html.read_text(encoding="utf-8")
    embedded = json.loads(re.search(r"var results = (\{.*?\});\n", html, re.S).group(1))
    expected = captions()
    assert sorted(embedded) == sorted(expected)  # the four figures and six tables, nothing else
    categories = json.loads(re.search(r"var categories = (\{.*?\});\n", html, re.S).group(1))
    assert set(categories) == STAGES

    dom = chromium(
        exe, with_script(report_html, PROBE, tmp_path / "probe.html"), tmp_path / "profile", "--dump-dom"
    )
    assert dom.returncode == 0, dom.stderr
    probe = re.search(r'<pre id="atlas-probe">(.*?)</pre>', dom.stdout, re.S)
    assert probe, dom.stdout[-2000:]
    seen = json.loads(probe.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))
    by_path = {item["path"]: item for item in seen["results"]}
    assert sorted(by_path) == sorted(expected)
    for path, caption in expected.items():
        assert " ".join(caption.split()) in " ".join(by_path[path]["text"].split()), path
        if path.endswith(".png"):
            width, height = by_path[path]["image"]  # drawn: the viewer decoded the PNG
            assert width > 100 and height > 100, (path, by_path[path]["image"])
    # the study's description on the first page
    assert "Sequential Tool Runtime Upgrade" in seen["start"]
    # run statistics: both charts drawn, from the run times of every rule of the pipeline
    assert all(size and size[0] > 100 and size[1] > 50 for size in seen["charts"].values()), seen["charts"]
    runtimes = json.loads(re.search(r"var runtimes_spec = (\{.*?\});\n", html, re.S).group(1))
    timed = {row["rule"] for row in runtimes["data"]["values"]}
    assert {"prepare_data", "build_tiny_model", "train", "validation", "report"} <= timed, timed

    shot = tmp_path / "report25.png"
    done = chromium(
        exe,
        with_script(report_html, SHOW_FIGURE, tmp_path / "figure.html"),
        tmp_path / "profile-shot",
        "--window-size=1400,900",
        f"--screenshot={shot}",
    )
    assert done.returncode == 0, done.stderr
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    print(f"\nreport screenshot: {shot}")


@pytest.mark.parametrize("config", sorted(p.parent.name for p in (REPO / ".test").glob("*/config.yaml")))
def test_dot_test_configs_plan_and_lint(config, tmp_path):
    """Each .test config plans the whole pipeline (`snakemake -n`) and lints clean."""
    wf = copy_workflow(mkdir(tmp_path / "wf"))
    configfile = f".test/{config}/config.yaml"
    plan = run_snakemake(wf, "-n", "-p", "--configfile", configfile, timeout=120)
    out = plan.stdout + plan.stderr
    assert "This was a dry-run" in out
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", out, re.M))
    assert int(jobs["total"]) >= 19 and "report" in jobs, out
    if config == "config_verl":
        assert "python -m atlas.stages.train_verl " in out and "python -m atlas.stages.train " not in out
    elif config == "config_gpu":
        assert re.search(r"rule train:(.|\n)*?resources: .*gpu=2", out)
        # every job that holds a model on the GPU claims one, so `--resources gpu=N` caps them all
        blocks = re.split(r"\n(?=(?:local)?rule \w+:)", out)
        claims = {
            m.group(1): re.search(r"resources: .*", b).group(0)
            for b in blocks
            if (m := re.match(r"(?:local)?rule (\w+):", b))
        }
        for rule in ("smoke", "boundary", "validation", "checks"):
            assert "gpu=1" in claims[rule], (rule, claims[rule])
        # and its share of GPU memory (resources.gpu_memory_gb), which reaches the stage
        kinds = dict(train=70, dose_step=70, smoke=18, boundary=18, validation=18, checks=22)
        for rule, gb in kinds.items():
            assert re.search(rf"gpu_mem_gb={gb}\b", claims[rule]), (rule, claims[rule])
        assert (
            "ATLAS_GPU_MEM_GB=70 torchrun" in out
            and "ATLAS_GPU_MEM_GB=22 python -m atlas.stages.checks" in out
        )
        # the distributed roundtrip takes one GPU per NCCL rank and claims no memory share
        assert "gpu=2" in claims["distributed_roundtrip"] and "gpu_mem" not in claims["distributed_roundtrip"]
    else:
        assert "python -m atlas.stages.train " in out
    lint = run_snakemake(wf, "--lint", "--configfile", configfile, timeout=120)
    assert "Congratulations, your workflow is in a good condition!" in lint.stdout + lint.stderr
