"""Validates rendered manifests (multi-document YAML) against Kubernetes' OpenAPI schemas.

    validate.py KUBERNETES_VERSION FILE

Strict: unknown fields fail. Prometheus Operator kinds (ServiceMonitor, PodMonitor,
PrometheusRule) are CRDs without a schema in kubernetes-validate; they are skipped by name
and each skip is printed. Exit 1 on any invalid or unknown-kind document.
"""
import sys

import kubernetes_validate
import yaml

CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def main() -> int:
    version, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    if not docs:
        print(f"  no documents in {path}")
        return 1
    failed = 0
    for doc in docs:
        name = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        if doc.get("kind") in CRD_KINDS:
            print(f"  skipped {name}: CRD ({doc.get('apiVersion')}), no schema in kubernetes-validate")
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
            print(f"  valid   {name}")
        except Exception as e:  # ValidationError, SchemaNotFoundError, ...
            print(f"  INVALID {name}: {e}")
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
