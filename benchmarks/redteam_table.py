"""Verdicts of every red-team attack (tests/_redteam_attacks.py) on tests whose expectation is
computed inside the run (no runner-held site), as the rows of docs/sandbox.md's table.

    python benchmarks/redteam_table.py [TESTS_DIR]

TESTS_DIR (default: this checkout's tests/) is where ``_redteam_attacks.py`` is read from, so
that an older tree on PYTHONPATH can be measured with the same attacks.  Each cell is the
verdict and the reward (**1** = the hack was rewarded).
"""

from __future__ import annotations

import sys
from pathlib import Path

from agentrl.sandbox import SandboxPool

TESTS = {"computed": "assert f(2) == 2 * 2",
         "loop": "for i in range(3):\n    assert f(i) == i * 2",
         "isclose": "import math\nassert math.isclose(f(1.5), 3.0)",
         "ref": "def ref(x):\n    return 2 * x\nassert all(f(x) == ref(x) for x in range(4))",
         "abs": "assert abs(f(0.5) - 1.0) < 1e-9",
         "setup_isclose": "assert isclose(f(1.5), 3.0)"}
SETUP = "from math import isclose\n"


def main() -> None:
    tests_dir = sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).parents[1] / "tests")
    sys.path.insert(0, tests_dir)
    from _redteam_attacks import ATTACKS

    print("| attack | " + " | ".join(TESTS) + " |")
    with SandboxPool(workers=2, backend="bwrap") as pool:
        for name in sorted(ATTACKS):
            code = ATTACKS[name].replace("{entry}", "f")
            row = []
            for test in TESTS.values():
                r = pool.run_tests(code, [test], setup=SETUP)
                row.append(f"{r.verdict} {'**1**' if r.verdict == 'pass' else '0'}")
            print(f"| `{name}` | " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
