"""benchmarks/model_families.py runs end to end on one family (a fresh subprocess per round)
and writes what docs/models.md's table shows. Slow: it starts a Python with torch and
transformers (about 20 s on the busy 2-core machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_one_family_one_round(tmp_path):
    out = tmp_path / "mf.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "model_families.py"), "--families", "phi3",
                        "--rounds", "1", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(out.read_text())
    r = res["families"]["phi3"]
    assert r["params"] == 108_224 and r["weights_mib"] == pytest.approx(108_224 * 4 / 2**20)
    assert r["startup_s"] == pytest.approx(r["engine_s"] + r["renderer_s"] + r["first_generate_s"])
    assert r["peak_rss_mib"] >= r["rss_after_imports_mib"] > 100 and r["drift"] is False
    assert "| phi3 | 108,224 | 0.41 |" in p.stdout
