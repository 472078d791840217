"""Parses a Prometheus text exposition on stdin with the reference client's parser
(Debian's python3-prometheus-client) and prints every sample as JSON lines:
{"name": ..., "labels": {...}, "value": ...}. Exits 3 when the parser is not installed."""
import json
import sys

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print("prometheus_client is not installed (Debian package python3-prometheus-client)",
          file=sys.stderr)
    sys.exit(3)

for family in text_string_to_metric_families(sys.stdin.read()):
    for sample in family.samples:
        print(json.dumps({"family": family.name, "type": family.type, "name": sample.name,
                          "labels": sample.labels, "value": sample.value}))
