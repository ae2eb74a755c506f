"""Summarises a CSV of numbers: count, mean and the versions of the numeric
libraries the image was built with."""
import csv
import statistics
import sys

import numpy
import pandas

with open(sys.argv[1], newline="") as f:
    values = [float(row["value"]) for row in csv.DictReader(f)]
print(f"rows={len(values)} mean={statistics.mean(values):.2f}")
print(f"numpy: {numpy.answer()}")
print(f"pandas: {pandas.answer()}" if hasattr(pandas, "answer") else f"pandas {pandas.__version__}")
