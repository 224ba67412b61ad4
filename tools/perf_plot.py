"""Draw the plot of a benchmark JSON (docs/perf/*.json) again, as the benchmark draws it.

    python tools/perf_plot.py docs/perf/NVIDIA-H200-2026-11-30-sweep.json   # writes the .png beside it
"""
import json
import sys
from pathlib import Path

from softlight.bench import plot

path = Path(sys.argv[1])
doc = json.loads(path.read_text())
print(plot(doc["meta"], doc["rows"], path.with_suffix(".png")))
