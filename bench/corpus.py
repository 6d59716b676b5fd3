"""Benchmark corpora: rollouts shaped like the producers' (see examples/).

- `multi_step`: a Crafter-style rollout, 20 steps, dual-serialized: trajectory steps and a
  full v3 trace whose time steps each hold an LM-call event (with a call record) and an
  environment event, plus system/user/assistant messages, every event and message listed
  twice (history and step), as the SDK's tracer writes them. About 90 KB of JSON.
- `single_step`: a math-style rollout with a summary trace, about 1.5 KB.
- `sized(n_bytes)`: a multi-step rollout grown (more steps) to about n_bytes.

Deterministic for a given seed, so runs are comparable.
"""

from __future__ import annotations

import random
from typing import Any

import orjson

ACTIONS = ["move_up", "move_down", "move_left", "move_right", "do", "sleep", "noop", "place_table"]
SEEN = ["tree", "water", "stone", "coal", "iron", "diamond", "cow", "zombie", "grass", "sand"]


def _obs(rng: random.Random, i: int) -> dict[str, Any]:
    seen = ", ".join(rng.sample(SEEN, 4))
    return {
        "text": f"step {i}: health 9/9 food 8/9 drink 7/9. You see {seen}. "
        f"Inventory: wood {rng.randint(0, 5)}."
    }


def _call_record(rng: random.Random, i: int, obs: dict[str, Any], args: str) -> dict[str, Any]:
    part = {"type": "text"}
    return {
        "call_id": f"{rng.getrandbits(64):016x}-{i}",
        "api_type": "chat_completions",
        "provider": "custom",
        "model_name": "Qwen/Qwen3-4B",
        "schema_version": "1.0",
        "started_at": "datetime.datetime(2025, 12, 14, 3, 5, 24, tzinfo=datetime.timezone.utc)",
        "completed_at": "datetime.datetime(2025, 12, 14, 3, 5, 25, tzinfo=datetime.timezone.utc)",
        "latency_ms": 900 + i,
        "request_params": {"temperature": 0.2},
        "input_messages": [
            {"role": "user", "parts": [dict(part, text=obs["text"])]},
        ],
        "output_text": "",
        "output_tool_calls": [
            {"name": "interact_many", "arguments_json": args, "call_id": f"call_{i}", "index": 0}
        ],
        "usage": {"input_tokens": 40 + i, "output_tokens": 12, "total_tokens": 52 + i},
        "finish_reason": "tool_calls",
        "outcome": "success",
    }


def multi_step(seed: int, n_steps: int = 20) -> dict[str, Any]:
    """A Crafter-style dual-serialized rollout with `n_steps` steps."""
    rng = random.Random(seed)
    run_id = f"bench-{seed:09d}-{rng.getrandbits(32):08x}"
    cid = f"trace_{rng.getrandbits(64):016x}"
    url = f"https://infer.example/v1/chat/completions?model=qwen&cid={cid}"
    observations = [_obs(rng, i) for i in range(n_steps + 1)]
    steps, time_steps, events, messages = [], [], [], []
    total = 0.0
    for i in range(n_steps):
        actions = rng.sample(ACTIONS, rng.randint(1, 3))
        args = orjson.dumps({"actions": actions}).decode()
        reward = rng.choice([0.0, 0.0, 0.0, 1.0])
        total += reward
        done = i == n_steps - 1
        steps.append(
            {
                "obs": observations[i],
                "tool_calls": [{"tool_name": "interact_many", "arguments": {"actions": actions}}],
                "reward": reward,
                "done": done,
                "truncated": False,
                "info": {
                    "achievements_added": [],
                    "meta": {"inference_url": url, "turn_index": i, "inference_ms": 900},
                },
            }
        )
        sid = f"decision_{i}"
        t = 1765681524.0 + i
        lm = {
            "system_instance_id": "policy:crafter-react",
            "time_record": {"event_time": t + 0.9, "message_time": None},
            "metadata": {"turn": i, "run_id": run_id, "step_id": sid},
            "event_metadata": None,
            "model_name": "Qwen/Qwen3-4B",
            "provider": "custom",
            "input_tokens": 40 + i,
            "output_tokens": 12,
            "total_tokens": 52 + i,
            "cost_usd": None,
            "latency_ms": 900 + i,
            "span_id": None,
            "trace_id": None,
            "call_records": [_call_record(rng, i, observations[i], args)],
        }
        env = {
            "system_instance_id": "environment:crafter",
            "time_record": {"event_time": t + 1.5, "message_time": None},
            "metadata": {"turn": i, "run_id": run_id, "op_index": 2 * i + 1, "step_id": sid},
            "event_metadata": None,
            "reward": reward,
            "terminated": done,
            "truncated": False,
            "system_state_before": observations[i],
            "system_state_after": observations[i + 1],
        }

        def message(
            kind: str,
            payload: dict[str, Any],
            extra: dict[str, Any] | None = None,
            t: float = t,
            i: int = i,
            sid: str = sid,
        ) -> dict[str, Any]:
            return {
                "content": {"text": None, "json_payload": orjson.dumps(payload).decode()},
                "message_type": kind,
                "time_record": {"event_time": t, "message_time": None},
                "metadata": {"turn": i, "step_id": sid, **(extra or {})},
            }

        step_messages = [
            message("user", {"role": "user", "content": observations[i]["text"]}),
            message(
                "assistant",
                {
                    "role": "assistant",
                    "tool_calls": [{"tool_name": "interact_many", "arguments": args}],
                },
                {"is_tool_call": True},
            ),
        ]
        events += [lm, env]
        messages += step_messages
        time_steps.append(
            {
                "step_id": sid,
                "step_index": i,
                # The Python repr form that SDK task apps write.
                "timestamp": f"datetime.datetime(2026, 12, 2, 9, 47, {i % 60}, "
                "tzinfo=datetime.timezone.utc)",
                "turn_number": i,
                "events": [lm, env],
                "markov_blanket_messages": step_messages,
                "step_metadata": {},
                "completed_at": None,
            }
        )
    return {
        "run_id": run_id,
        "trajectories": [
            {
                "env_id": f"env-{seed % 7}",
                "policy_id": f"pol-{seed % 3}",
                "steps": steps,
                "final": {"observation": observations[-1]},
                "length": n_steps,
                "inference_url": url,
                "decision_samples": None,
                "trace_correlation_id": cid,
            }
        ],
        "branches": {},
        "metrics": {
            "episode_returns": [total],
            "mean_return": total,
            "num_steps": n_steps,
            "num_episodes": 1,
            "outcome_score": None,
            "events_score": None,
            "details": {},
        },
        "aborted": False,
        "ops_executed": 2 * n_steps,
        "trace_correlation_id": None,
        "trace": {
            "session_id": run_id,
            "created_at": "datetime.datetime(2026, 12, 2, 9, 47, 36, tzinfo=datetime.timezone.utc)",
            "session_time_steps": time_steps,
            "event_history": events,
            "markov_blanket_message_history": messages,
            "metadata": {"run_id": run_id, "env_name": "crafter", "policy_id": f"pol-{seed % 3}"},
            "session_metadata": None,
        },
        "pipeline_metadata": {"inference_url": url, "trace_correlation_id": cid},
    }


def single_step(seed: int) -> dict[str, Any]:
    """A math-style single-step rollout with a summary trace."""
    rng = random.Random(seed)
    a, b = rng.randint(1, 99), rng.randint(1, 99)
    run_id = f"bench-math-{seed:09d}"
    cid = f"trace_{rng.getrandbits(64):016x}"
    url = f"https://infer.example/v1/chat/completions?cid={cid}"
    correct = rng.random() < 0.7
    reward = 1.0 if correct else 0.0
    answer = str(a + b if correct else a + b + 1)
    call = {"tool": "submit_answer", "args": {"answer": answer}}
    return {
        "run_id": run_id,
        "trajectories": [
            {
                "env_id": "math",
                "policy_id": "pol-math",
                "steps": [
                    {
                        "obs": {"problem": f"What is {a} + {b}?", "split": "train", "index": seed},
                        "tool_calls": [call],
                        "reward": reward,
                        "done": True,
                        "truncated": False,
                        "info": {"correct": correct, "meta": {"inference_url": url}},
                    }
                ],
                "final": {"observation": {"problem": f"What is {a} + {b}?"}, "reward": reward},
                "length": 1,
                "inference_url": url,
                "decision_samples": None,
            }
        ],
        "branches": {},
        "metrics": {"episode_returns": [reward], "mean_return": reward, "num_steps": 1},
        "aborted": False,
        "ops_executed": 2,
        "trace_correlation_id": cid,
        "trace": {
            "session_id": f"{rng.getrandbits(128):032x}",
            "events_count": 1,
            "decision_rewards": [reward],
            "lm_calls": [{"prompt": "...", "response": "...", "tool_calls": [call]}],
            "metadata": {"env_name": "math", "run_id": run_id},
        },
        "pipeline_metadata": {"inference_url": url, "trace_correlation_id": cid},
    }


def sized(n_bytes: int, seed: int = 0) -> bytes:
    """A multi-step rollout of about `n_bytes` of JSON (steps added until it is)."""
    per_step = len(orjson.dumps(multi_step(seed, 20))) / 20
    n_steps = max(1, round(n_bytes / per_step))
    return orjson.dumps(multi_step(seed, n_steps))


def corpus(kind: str, n: int, start: int = 0) -> list[bytes]:
    """`n` serialized rollouts of `kind` ('multi' or 'single')."""
    make = multi_step if kind == "multi" else single_step
    return [orjson.dumps(make(start + i)) for i in range(n)]
