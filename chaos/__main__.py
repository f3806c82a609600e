"""python -m chaos --scenario NAME [--short] --json OUT   (one scenario, its own Ray cluster)
python -m chaos --all [--short] --out-dir bench/results  (each scenario in turn, then a report)
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from llmserve.edge import ray_env

ray_env.apply()  # before anything imports Ray (its token mode is read at import)

from chaos import report  # noqa: E402
from chaos.scenarios import SCENARIOS, run  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m chaos",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--scenario", choices=sorted(SCENARIOS))
    which.add_argument("--all", action="store_true", help="every scenario, each in a subprocess")
    p.add_argument("--short", action="store_true", help="the CI form (default: the long form)")
    p.add_argument("--json", type=Path, help="where one scenario writes its figures")
    p.add_argument(
        "--out-dir",
        type=Path,
        default=Path("bench/results"),
        help="--all: where chaos.json and chaos.md go",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s chaos %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line a request otherwise
    if args.all:
        return run_all(args.short, args.out_dir)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    figures = run(args.scenario, args.short)
    result = {
        "scenario": args.scenario,
        "form": "short" if args.short else "long",
        "started": started,
        "duration_s": round(time.monotonic() - t0, 1),
        **figures,
    }
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0


def run_all(short: bool, out_dir: Path) -> int:
    """Each scenario in its own process (and so its own Ray cluster), one after the other."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results, failed = [], []
    for name in SCENARIOS:
        out = out_dir / f"chaos-{name}.json"
        cmd = [sys.executable, "-m", "chaos", "--scenario", name, "--json", str(out)]
        logging.info("running %s", " ".join(cmd[1:] + (["--short"] if short else [])))
        if subprocess.run(cmd + (["--short"] if short else [])).returncode != 0:
            failed.append(name)
            continue
        results.append(json.loads(out.read_text()))
        out.unlink()
    (out_dir / "chaos.json").write_text(json.dumps(results, indent=2) + "\n")
    (out_dir / "chaos.md").write_text(report.markdown(results))
    print(report.markdown(results))
    if failed:
        print(f"scenarios that did not finish: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
