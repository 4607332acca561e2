"""SkyRL's PPO entrypoint with DrCredit's advantages (see docs/trainers.md, SkyRL).

    python examples/skyrl/main_drcredit.py trainer.algorithm.advantage_estimator=drcredit \
        generator.n_samples_per_prompt=8 environment.env_class=<your SkyRL-Gym env> ...

Same command line as ``skyrl.train.entrypoints.main_base``; the dataset's ``env_extras`` carry
``question`` and ``rubrics``. Needs SkyRL's GPU stack (vLLM, FSDP workers): the adapter's
pieces are tested on the CPU (tests/trainers/test_skyrl_adapter.py), this script is not run
by the project's tests.
"""

from __future__ import annotations

import sys
from typing import Any

import ray
from skyrl.train.config import SkyRLTrainConfig
from skyrl.train.entrypoints.main_base import BasePPOExp
from skyrl.train.utils import validate_cfg
from skyrl.train.utils.utils import initialize_ray

from drcredit.trainers import skyrl as drcredit_skyrl


class DrCreditPPOExp(BasePPOExp):
    """SkyRL's experiment whose generator is wrapped by DrCredit."""

    def get_generator(self, cfg: Any, tokenizer: Any, inference_engine_client: Any) -> Any:
        inner = super().get_generator(cfg, tokenizer, inference_engine_client)
        return drcredit_skyrl.DrCreditGenerator(inner, tokenizer=tokenizer)  # settings from DRCREDIT_* variables


@ray.remote(num_cpus=1)
def entrypoint(cfg: SkyRLTrainConfig) -> None:
    drcredit_skyrl.register()  # in the process that builds the trainer, too
    DrCreditPPOExp(cfg).run()


def main() -> None:
    drcredit_skyrl.register()  # before validate_cfg looks the estimator up by name
    cfg = SkyRLTrainConfig.from_cli_overrides(sys.argv[1:])
    validate_cfg(cfg)
    initialize_ray(cfg)
    ray.get(entrypoint.remote(cfg))


if __name__ == "__main__":
    main()
