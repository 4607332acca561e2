"""The SkyRL adapter against the installed skyrl (0.3.0) and the real service.

Runs only where skyrl is installed (the project's own test run skips it); scripts/test runs
it in .venv-trainers. Real parts: SkyRL's ``SkyRLGymGenerator`` (its multi-turn agent loop,
token-in-token-out) driving a SkyRL-Gym env through skyrl_gym's registry, SkyRL's
``prepare_generator_input``, a ``RayPPOTrainer``'s own ``generate``,
``postprocess_generator_output``, ``convert_to_training_input`` and
``compute_advantages_and_returns``, the estimator registry, and SkyRL's ``regular`` policy
loss backpropagated through a tiny model. The inference engine is a scripted client (vLLM
does not run here) and the trainer's worker dispatch a one-rank stand-in (its FSDP workers
need GPUs); see docs/trainers.md.
"""

from __future__ import annotations

import asyncio
import copy
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("skyrl")
torch = pytest.importorskip("torch")

from drcredit.trainers import skyrl as adapter  # noqa: E402
from tests.trainers.skyrl_parts import (  # noqa: E402
    CHAT_TEMPLATE,
    ENV_ID,
    EXAMPLE,
    PAGE_IDS,
    SEARCH_REWARD,
    PostingClient,
    ScriptedEngine,
    make_env_class,
    script,
    visit_page_ids,
)

ppo_utils = adapter.import_skyrl("skyrl.backends.skyrl_train.utils.ppo_utils")  # loads on Python 3.11 too

import skyrl_gym  # noqa: E402
from skyrl.train.config import AlgorithmConfig, GeneratorConfig, SkyRLGymConfig, SkyRLTrainConfig  # noqa: E402
from skyrl.train.generators.skyrl_gym_generator import SkyRLGymGenerator  # noqa: E402
from skyrl.train.generators.utils import prepare_generator_input  # noqa: E402
from skyrl.train.trainer import RayPPOTrainer  # noqa: E402

from drcredit.client import DrCreditClient  # noqa: E402
from drcredit.trainers.settings import DrCreditSettings  # noqa: E402
from drcredit.trainers.tokens import turn_advantages  # noqa: E402
from tests.support.judge_server import Reply, running_judge  # noqa: E402
from tests.support.judged_service import judged_service  # noqa: E402
from tests.trainers.tiny import byte_tokenizer  # noqa: E402

SAMPLES = 4
#: per prompt, the example rollout each sample plays
PLAYS = {"q-a": [0, 1, 2, 3], "q-b": [4, 5, 6, 7]}

if ENV_ID not in skyrl_gym.registry:
    skyrl_gym.register(id=ENV_ID, entry_point=make_env_class())


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return byte_tokenizer(CHAT_TEMPLATE)


@pytest.fixture(scope="module", autouse=True)
def registered() -> Any:
    return adapter.register()


def generation(
    tokenizer: Any,
    service: str,
    *,
    stream: bool,
    report_messages: bool = False,
    max_turns: int = 8,
    answer_last_call: bool = False,
    engine_eos: bool = True,
    multi_turn: bool = True,
    **settings: Any,
) -> Any:
    """A SkyRL generator wrapped by DrCredit (with a :class:`PostingClient`), its engine, and one
    training step's input."""
    engine = ScriptedEngine(tokenizer, eos=engine_eos)
    config = GeneratorConfig(
        n_samples_per_prompt=SAMPLES,
        max_turns=max_turns,
        max_input_length=100_000,
        use_conversation_multi_turn=multi_turn,
    )
    inner = SkyRLGymGenerator(config, SkyRLGymConfig(max_env_workers=0), engine, tokenizer)
    wrapped = adapter.DrCreditGenerator(
        inner,
        settings=DrCreditSettings(
            base_url=service, timeout_s=120, **{"id_prefix": "sky-", "run": "skyrun", **settings}
        ),
        stream=stream,
        client=PostingClient(service),
    )
    prompts = [
        {
            "prompt": [{"role": "user", "content": "Research: " + EXAMPLE["question"]}],
            "env_class": ENV_ID,
            "env_extras": {
                "question": EXAMPLE["question"],
                "rubrics": EXAMPLE["rubrics"],
                "report_messages": report_messages,
                "answer_last_call": answer_last_call,
            },
            "uid": uid,
        }
        for uid in PLAYS
    ]
    batch, uids = prepare_generator_input(prompts, SAMPLES, {}, ENV_ID, "train", 3)
    for i, trajectory in enumerate(batch["trajectory_ids"]):
        rollout = PLAYS[trajectory.instance_id][trajectory.repetition_id]
        batch["env_extras"][i]["rollout"] = rollout
        engine.rollout_of[trajectory.to_string()] = rollout
    return wrapped, engine, batch, uids


def trainer_for(generator: Any, tokenizer: Any, engine: Any) -> Any:
    cfg = SkyRLTrainConfig()
    cfg.trainer.algorithm.advantage_estimator = adapter.ESTIMATOR_NAME
    cfg.generator.n_samples_per_prompt = SAMPLES
    cfg.trainer.train_batch_size = cfg.trainer.policy_mini_batch_size = len(PLAYS)  # prompts per step
    cfg.generator.inference_engine.enable_ray_prometheus_stats = False  # scrapes a Ray cluster's vLLM
    trainer = RayPPOTrainer(cfg, None, tokenizer, None, engine, generator)
    trainer.dispatch = types.SimpleNamespace(get_lcm_dp_size=lambda: 1)  # stands in for the GPU workers
    return trainer


def token_layout(engine: ScriptedEngine, session: str, loss_mask: list[int]) -> list[tuple[int, int]]:
    """Each generation's span in the response: the maximal runs of policy tokens, checked against
    what the engine generated (SkyRL concatenates generation, observation, generation, ...)."""
    mask = np.asarray(loss_mask)
    edges = np.diff(np.concatenate(([0], mask, [0])))
    spans = list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist(), strict=True))
    assert [end - start for start, end in spans] == [len(ids) for ids in engine.generated[session]]
    return spans


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "batch"])
def test_a_training_step_gets_the_services_advantages(tokenizer: Any, service: str, stream: bool) -> None:
    generator, engine, batch, uids = generation(tokenizer, service, stream=stream, report_messages=not stream)
    trainer = trainer_for(generator, tokenizer, engine)
    output = asyncio.run(trainer.generate(copy.deepcopy(batch)))
    scored = generator.last_scored
    assert scored is not None and len(set(scored.group_ids)) == 2

    with DrCreditClient(service) as client:
        for i, trajectory in enumerate(batch["trajectory_ids"]):
            session = trajectory.to_string()
            group_id = scored.group_ids[i]
            document = client.advantages(group_id, wait=30)
            values = turn_advantages(document, f"r{trajectory.repetition_id}")
            turns = script(PLAYS[trajectory.instance_id][trajectory.repetition_id])
            assert len(values) == len(turns)
            rewards, mask = np.asarray(output["rewards"][i]), np.asarray(output["loss_masks"][i])
            spans = token_layout(engine, session, output["loss_masks"][i])
            for value, (start, end) in zip(values, spans, strict=True):
                np.testing.assert_allclose(rewards[start:end], value, rtol=0, atol=1e-6)
            assert not rewards[mask == 0].any()  # tool responses and padding: 0
            # the outcome the service normalized: the env's turn-level rewards, added up
            rollout = next(r for r in document["rollouts"] if r["id"] == f"r{trajectory.repetition_id}")
            searches = sum(1 for t in turns if t["type"] == "search")
            expected = EXAMPLE["rollouts"][PLAYS[trajectory.instance_id][trajectory.repetition_id]]["outcome_reward"]
            assert rollout["outcome_reward"] == pytest.approx(expected + SEARCH_REWARD * searches)
            metadata = client.group_status(group_id)["metadata"]
            assert metadata == {"run": "skyrun", "step": 3}
            # the page ids the visit tool printed, renamed only where they collide (skyrl_parts.PAGE_IDS)
            posted = generator.client.posted[(group_id, f"r{trajectory.repetition_id}")]
            assert visit_page_ids(posted) == PAGE_IDS[PLAYS[trajectory.instance_id][trajectory.repetition_id]]
    assert any(len({round(float(v), 5) for v in np.asarray(r)[np.asarray(r) != 0]}) > 1 for r in output["rewards"])

    # SkyRL's own trainer path from here: per-token rewards, tensors, the registered estimator
    output, uids = trainer.postprocess_generator_output(output, uids)
    data = trainer.convert_to_training_input(output, uids)
    data["values"] = None  # what fwd_logprobs_values_reward leaves without a critic (its forward passes need GPUs)
    data = trainer.compute_advantages_and_returns(data)
    advantages, loss_mask = data["advantages"], data["loss_mask"]
    response_length = data["response_mask"].shape[1]
    for i, rewards in enumerate(output["rewards"]):
        expected = torch.zeros(response_length)  # SkyRL right-aligns responses in the batch
        expected[response_length - len(rewards) :] = torch.tensor(rewards)
        torch.testing.assert_close(advantages[i], expected)
    assert not advantages[loss_mask == 0].any()

    # SkyRL's regular PPO loss on these advantages, through a tiny model: tool tokens get no gradient
    torch.manual_seed(0)
    responses = data["sequences"][:, -response_length:]
    embedding = torch.nn.Embedding(len(tokenizer), 8)
    head = torch.nn.Linear(8, len(tokenizer))
    log_probs = torch.log_softmax(head(embedding(responses)), dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)
    loss_fn = ppo_utils.PolicyLossRegistry.get("regular")
    loss, _ = loss_fn(log_probs, log_probs.detach(), advantages, trainer.cfg.trainer.algorithm, loss_mask)
    loss.backward()
    assert torch.isfinite(loss) and embedding.weight.grad is not None
    assert embedding.weight.grad.abs().sum() > 0


def test_the_estimator_is_skyrls_and_refuses_unscored_rows() -> None:
    config = AlgorithmConfig()
    rewards = torch.tensor([[0.5, -0.25, 0.0], [1.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adapter._remember(["u1"])
    advantages, returns = ppo_utils.compute_advantages_and_returns(
        token_level_rewards=rewards, response_mask=mask, index=["u1", "u1"], adv_estimator="drcredit", config=config
    )
    torch.testing.assert_close(advantages, torch.tensor([[0.5, -0.25, 0.0], [1.0, 0.0, 0.0]]))
    torch.testing.assert_close(returns, advantages)
    with pytest.raises(RuntimeError, match="DrCreditGenerator did not score"):
        ppo_utils.compute_advantages_and_returns(
            token_level_rewards=rewards,
            response_mask=mask,
            index=["never"] * 2,
            adv_estimator="drcredit",
            config=config,
        )
    config.use_kl_in_reward = True
    with pytest.raises(ValueError, match="use_kl_loss"):
        ppo_utils.compute_advantages_and_returns(
            token_level_rewards=rewards, response_mask=mask, index=["u1"] * 2, adv_estimator="drcredit", config=config
        )
    assert adapter.register() is ppo_utils.AdvantageEstimatorRegistry.get("drcredit")  # idempotent


def test_exclude_takes_unscorable_turns_out_of_the_loss(tokenizer: Any, tmp_path: Path) -> None:
    """Every visit judgment fails (the judge answers no JSON): under exclude, visit tokens leave the loss."""
    with (
        running_judge(lambda c: Reply(content="no json")) as judge,
        judged_service(f"sqlite:///{tmp_path / 'x.sqlite3'}", judge.url) as url,
        pytest.warns(UserWarning, match="failed"),
    ):
        generator, engine, batch, _ = generation(
            tokenizer, url, stream=False, params={"on_judge_failure": "exclude"}, id_prefix="skyx-"
        )
        before: list[Any] = []
        inner_generate = generator.inner.generate

        async def capture(input_batch: Any, **kwargs: Any) -> Any:
            out = await inner_generate(input_batch, **kwargs)
            before.append(copy.deepcopy(out))
            return out

        generator.inner.generate = capture
        output = asyncio.run(generator.generate(copy.deepcopy(batch)))
    scored = generator.last_scored
    left_out = kept = visits_left_out = 0
    for i, trajectory in enumerate(batch["trajectory_ids"]):
        turns = script(PLAYS[trajectory.instance_id][trajectory.repetition_id])
        spans = token_layout(engine, trajectory.to_string(), before[0]["loss_masks"][i])
        document = scored.documents[scored.group_ids[i]]
        rollout = next(r for r in document["rollouts"] if r["id"] == f"r{trajectory.repetition_id}")
        mask, rewards = output["loss_masks"][i], output["rewards"][i]
        for turn, scored_turn, (start, end) in zip(turns, rollout["turns"], spans, strict=True):
            if scored_turn["unscorable"]:  # visits judged, and the searches whose results they visited
                left_out += 1
                assert not any(mask[start:end]) and not any(rewards[start:end])
            else:
                kept += 1
                assert all(mask[start:end])
            visits_left_out += turn["type"] == "visit" and scored_turn["unscorable"]
    assert left_out and kept and visits_left_out and output["rollout_metrics"]["drcredit/excluded_tokens"] > 0


def test_eval_generations_pass_through(tokenizer: Any, service: str) -> None:
    generator, _, batch, _ = generation(tokenizer, service, stream=True)
    batch["batch_metadata"].training_phase = "eval"
    output = asyncio.run(generator.generate(copy.deepcopy(batch)))
    assert generator.last_scored is None
    assert all(isinstance(r, list) and sum(r) >= 0 for r in output["rewards"])  # SkyRL's own rewards


def test_service_down_stops_the_step(tokenizer: Any) -> None:
    """Nothing listens at the URL: the step waits (briefly here), then raises instead of training on zeros."""
    from drcredit.trainers.service import DrCreditUnavailable
    from tests.support.live import free_port

    client = DrCreditClient(f"http://127.0.0.1:{free_port()}", max_attempts=1)
    for stream in (True, False):
        generator, _, batch, _ = generation(
            tokenizer, client.base_url, stream=stream, unreachable_timeout_s=0.5, id_prefix=f"down{stream}-"
        )
        generator.client = client
        with pytest.raises(DrCreditUnavailable, match="could not be reached"):
            asyncio.run(generator.generate(copy.deepcopy(batch)))
    client.close()


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "batch"])
@pytest.mark.parametrize("report_messages", [False, True], ids=["tokens", "env-messages"])
def test_a_trajectory_cut_after_a_tool_call_keeps_its_response(
    tokenizer: Any, service: str, stream: bool, report_messages: bool
) -> None:
    """Turn budget 3: every trajectory ends on its third turn, a tool call. The env answers it on
    that last step; SkyRL leaves the answer out of the response tokens, the adapter keeps it."""
    for answered in (True, False):
        generator, _, batch, _ = generation(
            tokenizer,
            service,
            stream=stream,
            report_messages=report_messages,
            max_turns=3,
            answer_last_call=answered,
            id_prefix=f"cut{stream}{report_messages}{answered}-",
        )
        asyncio.run(generator.generate(copy.deepcopy(batch)))
        scored = generator.last_scored
        assert scored is not None
        for i, trajectory in enumerate(batch["trajectory_ids"]):
            played = script(PLAYS[trajectory.instance_id][trajectory.repetition_id])[2]
            posted = generator.client.posted[(scored.group_ids[i], f"r{trajectory.repetition_id}")]
            assert len(posted["turns"]) == 3
            last = posted["turns"][-1]
            assert last["type"] == played["type"]
            if played["type"] == "search":
                got = ([r["url"] for r in last["results"]], last["error"])
                assert got == (([r["url"] for r in played["results"]], None) if answered else ([], "no response"))
            else:
                got = [(p["url"], p["error"] or None) for p in last["pages"]]
                expected = [(p["url"], p.get("error") or None) for p in played["pages"]]
                assert got == (expected if answered else [(p["url"], "no response") for p in played["pages"]])


def test_the_adapter_and_the_example_import_skyrl_on_this_python(tmp_path: Path) -> None:
    """examples/skyrl/main_drcredit.py against the installed skyrl (it is not run: GPUs), in a fresh
    interpreter with nothing patched by the tests (Python 3.11 here, where skyrl 0.3.0's trainer
    modules fail to import on their own): register(), DrCreditGenerator and the example load;
    the entrypoint's Ray task unpickles in another fresh interpreter without importing skyrl's
    trainer modules, and builds the experiment class there."""
    import subprocess
    import sys

    example = Path(__file__).resolve().parents[2] / "examples" / "skyrl" / "main_drcredit.py"
    pickled = tmp_path / "entrypoint.pkl"
    driver = f"""
import runpy, sys
import ray.cloudpickle as cloudpickle
from drcredit.trainers import skyrl as adapter
assert "skyrl.tinker.types" not in sys.modules
adapter.register()
assert adapter.DrCreditGenerator.__mro__[1].__name__ == "GeneratorInterface"
names = runpy.run_path({str(example)!r})
from skyrl.train.entrypoints.main_base import BasePPOExp
assert issubclass(names["experiment_class"](), BasePPOExp) and callable(names["main"])
open({str(pickled)!r}, "wb").write(cloudpickle.dumps(names["entrypoint"]._function))
"""
    worker = f"""
import sys
import ray.cloudpickle as cloudpickle
task = cloudpickle.loads(open({str(pickled)!r}, "rb").read())
assert "skyrl.tinker.types" not in sys.modules, "unpickling the task imported skyrl's trainer modules"
task.__globals__["drcredit_skyrl"].register()
from skyrl.train.entrypoints.main_base import BasePPOExp
assert issubclass(task.__globals__["experiment_class"](), BasePPOExp)
"""
    for code in (driver, worker):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]


def test_a_trajectory_without_policy_tokens_is_a_rollout_with_no_turns(tokenizer: Any) -> None:
    """SkyRL's overlong filtering zeroes a loss mask before the batch path reads it: that row is a
    rollout with no turns (nothing to train), not an error stopping the step."""
    from drcredit.trainers.skyrl_rows import rows_from_output

    trajectories = [types.SimpleNamespace(instance_id="u", repetition_id=k) for k in range(2)]
    extras = {"question": EXAMPLE["question"], "rubrics": EXAMPLE["rubrics"]}
    ids = tokenizer.encode("<answer>x</answer>", add_special_tokens=False)
    output = {
        "response_ids": [ids, ids],
        "loss_masks": [[1] * len(ids), [0] * len(ids)],
        "rewards": [1.0, 0.0],
        "env_metrics": [{}, {}],
    }
    rows = rows_from_output(
        {"trajectory_ids": trajectories, "env_extras": [extras, extras]}, output, tokenizer, DrCreditSettings()
    )
    assert [len(r.turns) for r in rows] == [1, 0] and rows[1].spans == []


def test_in_single_turn_mode_the_appended_eos_carries_the_last_turns_advantage(tokenizer: Any, service: str) -> None:
    """use_conversation_multi_turn=false and generations that end without EOS: SkyRL appends one
    EOS with loss mask 1 after the last generation; it is part of the last turn's policy tokens."""
    generator, engine, batch, _ = generation(
        tokenizer, service, stream=False, engine_eos=False, multi_turn=False, id_prefix="eos-"
    )
    output = asyncio.run(generator.generate(copy.deepcopy(batch)))
    scored = generator.last_scored
    assert scored is not None
    for i, trajectory in enumerate(batch["trajectory_ids"]):
        ids, mask, rewards = output["response_ids"][i], output["loss_masks"][i], output["rewards"][i]
        assert ids[-1] == tokenizer.eos_token_id and mask[-1] == 1  # appended by SkyRL
        generated = engine.generated[trajectory.to_string()][-1]
        assert ids[-1 - len(generated) : -1] == generated  # right after the last generation
        document = scored.documents[scored.group_ids[i]]
        last = turn_advantages(document, f"r{trajectory.repetition_id}")[-1]
        assert rewards[-1] == pytest.approx(last, abs=1e-6) and rewards[-2] == pytest.approx(last, abs=1e-6)
