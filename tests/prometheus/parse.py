#!/usr/bin/env python3
"""Parse a Prometheus text-format file with prometheus_client's own parser and print it as
JSON: [{"name", "type", "help", "samples": [{"name", "labels", "value"}]}]. For
tests/it/metrics.rs. Usage: parse.py FILE"""
import json
import sys

from prometheus_client.parser import text_string_to_metric_families

with open(sys.argv[1], encoding="utf-8") as f:
    text = f.read()
families = [
    {
        "name": fam.name,
        "type": fam.type,
        "help": fam.documentation,
        "samples": [
            {"name": s.name, "labels": dict(s.labels), "value": s.value} for s in fam.samples
        ],
    }
    for fam in text_string_to_metric_families(text)
]
json.dump(families, sys.stdout)
