"""The runtime stages of the pipeline run (smoke and boundary): no protocol violation, every
episode and case passes."""

import json

from atlas.hashing import verify


def test_runtime_stages_of_the_pipeline_run(pipeline):
    # The runtime stages of the pipeline run (smoke: 4 questions, one sample each): 0 violations,
    # every episode and case passes. (A grader edit reruns them: tests/reruns/test_report_plans.py.)
    protocol = json.loads((pipeline / "results/runs/smoke/protocol.json").read_text())
    assert protocol["violations"] == 0 and protocol["episodes"] == protocol["completed"] == 4
    assert protocol["records"] == protocol["generations"] == protocol["calls"] >= 4
    boundary = json.loads((pipeline / "results/runs/boundary/boundary.json").read_text())
    assert boundary["passed"] == boundary["cases"] == 12 and boundary["protocol_violations"] == 0
    assert verify(pipeline / "results/runs/smoke", check_sources=False) == []
