"""SkyRL's PPO entrypoint with DrCredit's advantages (see docs/trainers.md, SkyRL).

    python examples/skyrl/main_drcredit.py trainer.algorithm.advantage_estimator=drcredit \
        generator.n_samples_per_prompt=8 environment.env_class=<your SkyRL-Gym env> ...

Same command line as ``skyrl.train.entrypoints.main_base``; the dataset's ``env_extras`` carry
``question`` and ``rubrics``. Needs SkyRL's GPU stack (vLLM, FSDP workers): the adapter's
pieces are tested on the CPU (tests/trainers/test_skyrl_adapter.py), this script is not run
by the project's tests.

Python 3.11: skyrl's trainer modules load there only through ``drcredit_skyrl.import_skyrl``
(see ``drcredit.trainers.skyrl``), so this script imports them through it, after the module
level (and, in the Ray task, inside the task): nothing here that Ray ships to a worker
names a skyrl trainer class at module level.
"""

from __future__ import annotations

import sys
from typing import Any

import ray
from skyrl.train.config import SkyRLTrainConfig

from drcredit.trainers import skyrl as drcredit_skyrl


def experiment_class() -> type:
    """SkyRL's ``BasePPOExp`` whose generator is wrapped by DrCredit."""
    base: Any = drcredit_skyrl.import_skyrl("skyrl.train.entrypoints.main_base").BasePPOExp

    class DrCreditPPOExp(base):  # type: ignore[misc]
        def get_generator(self, cfg: Any, tokenizer: Any, inference_engine_client: Any) -> Any:
            inner = super().get_generator(cfg, tokenizer, inference_engine_client)
            return drcredit_skyrl.DrCreditGenerator(inner, tokenizer=tokenizer)  # settings from DRCREDIT_* variables

    return DrCreditPPOExp


@ray.remote(num_cpus=1)
def entrypoint(cfg: SkyRLTrainConfig) -> None:
    drcredit_skyrl.register()  # in the process that builds the trainer, too
    experiment_class()(cfg).run()


def main() -> None:
    drcredit_skyrl.register()  # before validate_cfg looks the estimator up by name
    utils = drcredit_skyrl.import_skyrl("skyrl.train.utils")
    initialize_ray = drcredit_skyrl.import_skyrl("skyrl.train.utils.utils").initialize_ray
    cfg = SkyRLTrainConfig.from_cli_overrides(sys.argv[1:])
    utils.validate_cfg(cfg)
    initialize_ray(cfg)
    ray.get(entrypoint.remote(cfg))


if __name__ == "__main__":
    main()
