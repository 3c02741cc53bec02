# Two commands matter: `make train` and `make test`. Each sets up .venv on first use.
# `make train` first validates the config in one process (--check-config), so a bad key prints one line
# instead of torchrun's error report.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
TRAIN_ARGS ?=

.PHONY: train test setup clean

setup: $(STAMP)

# Reuse a system torch (GPU images ship one with its triton); otherwise take the CPU build of torch 2.13 and
# triton 3.6, the release the GPU image has (the CPU tests run its interpreter; newer interpreters differ).
$(STAMP): pyproject.toml
	@if $(PY) -c "import torch" 2>/dev/null; then $(PY) -m venv --system-site-packages $(VENV); else $(PY) -m venv $(VENV); fi
	@$(VPY) -c "import torch" 2>/dev/null || $(VPY) -m pip install -q "torch==2.13.0" "triton==3.6.0"
	$(VPY) -m pip install -q -e ".[dev]"
	@touch $(STAMP)

train: $(STAMP)
	@NGPU=$$($(VPY) -c "import torch; print(torch.cuda.device_count())"); \
	if [ "$$NGPU" -gt 0 ]; then \
		echo "make train: $$NGPU GPU(s) found: train_configs/llama_moe.toml"; \
		WORLD_SIZE=$$NGPU $(VPY) launch/train.py --config train_configs/llama_moe.toml --check-config $(TRAIN_ARGS) && \
		$(VENV)/bin/torchrun --standalone --nproc_per_node=$$NGPU launch/train.py --config train_configs/llama_moe.toml $(TRAIN_ARGS); \
	else \
		echo "make train: no GPU found: running train_configs/debug_moe.toml on CPU with 2 processes (gloo)"; \
		WORLD_SIZE=2 $(VPY) launch/train.py --config train_configs/debug_moe.toml --check-config $(TRAIN_ARGS) && \
		$(VENV)/bin/torchrun --standalone --nproc_per_node=2 launch/train.py --config train_configs/debug_moe.toml $(TRAIN_ARGS); \
	fi

test: $(STAMP)
	$(VPY) -m pytest -q tests

clean:
	rm -rf $(VENV) outputs
