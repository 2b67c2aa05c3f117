# Shortcuts for the scripts the README documents.
.PHONY: lab test lock bench
lab:
	bash scripts/lab.sh
test:
	bash scripts/test.sh
lock:
	bash scripts/lock.sh
bench:
	bash scripts/setup.sh && .venv/bin/python benchmarks/train_throughput.py && .venv/bin/python benchmarks/panel_overhead.py
