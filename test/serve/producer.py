"""An agent that publishes its trajectories to rlstream's log itself, written from docs/events.md alone: confluent-kafka's
Producer (with the murmur2 partitioner) and AvroSerializer against the schema registry (record-name subjects,
the schemas rlstream registered), events in the documented order, keyed by group_id.

The token ids of each episode come from the test (the model's tokenizer is not the point here); everything about
the events (ids, masks, offsets, versions, groups) is built here.

Environment: KAFKA_BROKERS, SCHEMA_REGISTRY_URL, RLSTREAM_RUN_ID, RLSTREAM_EPISODES (JSON: a list of groups, each
a list of episodes {prompt_messages, prompt_ids, turns: [{role, ids, text, tool_calls?}], ground_truth, data_source}).
Prints {"sent": n}.
"""

import hashlib
import json
import os
import sys
import time

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient, record_subject_name_strategy
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext, StringSerializer

BROKERS = os.environ["KAFKA_BROKERS"]
REGISTRY = os.environ["SCHEMA_REGISTRY_URL"]
RUN_ID = os.environ["RLSTREAM_RUN_ID"]
GROUPS = json.loads(os.environ["RLSTREAM_EPISODES"])
TOPIC = "rollout.events"
EVENTS = ["TrajectoryStarted", "TurnCompleted", "ToolCallCompleted", "TrajectoryCompleted"]
POLICY_VERSION = 0  # this agent samples from the warm start and never loads another version


def event_id(*parts):
    return hashlib.sha256("\0".join(map(str, parts)).encode()).hexdigest()[:32]


def main():
    registry = SchemaRegistryClient({"url": REGISTRY})
    serializers = {}
    for name in EVENTS:
        subject = f"rlstream.events.{name}"
        schema = registry.get_latest_version(subject).schema
        serializers[name] = AvroSerializer(
            registry,
            schema.schema_str,
            conf={"subject.name.strategy": record_subject_name_strategy, "auto.register.schemas": False, "use.latest.version": True},
        )
    key_serializer = StringSerializer("utf_8")
    # librdkafka's default partitioner (consistent_random, CRC32) would place keys elsewhere than Kafka's Java client.
    producer = Producer({"bootstrap.servers": BROKERS, "partitioner": "murmur2_random", "enable.idempotence": True})
    errors = []
    sent = 0

    def send(name, key, value):
        nonlocal sent
        ctx = SerializationContext(TOPIC, MessageField.VALUE)
        producer.produce(TOPIC, key=key_serializer(key), value=serializers[name](value, ctx), on_delivery=lambda err, _msg: err and errors.append(str(err)))
        sent += 1

    for g, episodes in enumerate(GROUPS):
        group_id = event_id(RUN_ID, "group", g)
        for k, ep in enumerate(episodes):
            trajectory_id = event_id(group_id, "trajectory", k)
            now = int(time.time() * 1000)
            dataset = {"name": "python-agent", "split": "train", "index": g}
            sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 64, "seed": None, "stop_token_ids": []}
            extra = json.dumps({"producer": "python"})
            send("TrajectoryStarted", group_id, {
                "event_id": event_id(trajectory_id, "started"), "time_ms": now, "run_id": RUN_ID,
                "trajectory_id": trajectory_id, "group_id": group_id, "sample_index": k, "group_size": len(episodes),
                "agent_name": "python", "data_source": ep["data_source"], "dataset": dataset,
                "prompt_messages": [{"role": m["role"], "content": m["content"], "tool_calls": [], "tool_call_id": None, "name": None} for m in ep["prompt_messages"]],
                "prompt_token_ids": ep["prompt_ids"], "tools": [], "sampling": sampling, "policy_version": POLICY_VERSION,
                "ground_truth": ep["ground_truth"], "extra_info_json": extra,
            })
            response_ids, mask, logprobs, versions, offsets, roles = [], [], [], [], [], []
            num_tool_calls = 0
            last_assistant = -1
            text = ""
            for t, turn in enumerate(ep["turns"]):
                generated = turn["role"] == "assistant"
                offsets.append(len(response_ids))
                roles.append(turn["role"])
                ids = turn["ids"]
                turn_logprobs = [-0.5] * len(ids) if generated else []
                response_ids += ids
                mask += [1 if generated else 0] * len(ids)
                logprobs += turn_logprobs if generated else [0.0] * len(ids)
                versions += [POLICY_VERSION if generated else -1] * len(ids)
                text += turn["text"]
                calls = [{"id": c["id"], "name": c["name"], "arguments_json": c["arguments_json"]} for c in turn.get("tool_calls", [])]
                send("TurnCompleted", group_id, {
                    "event_id": event_id(trajectory_id, "turn", t), "time_ms": int(time.time() * 1000), "run_id": RUN_ID,
                    "trajectory_id": trajectory_id, "group_id": group_id, "turn_index": t, "role": turn["role"],
                    "token_ids": ids, "logprobs": turn_logprobs, "response_mask": [1 if generated else 0] * len(ids), "text": turn["text"],
                    "tool_calls": calls, "tool_call_parse_error": None, "finish_reason": "stop" if generated else None,
                    "policy_version": POLICY_VERSION if generated else -1, "latency_ms": 1.0, "server": "python" if generated else None,
                    "tokenization_mismatch": False,
                })
                if generated:
                    last_assistant = t
                for c in calls:
                    num_tool_calls += 1
                    send("ToolCallCompleted", group_id, {
                        "event_id": event_id(trajectory_id, "tool", c["id"]), "time_ms": int(time.time() * 1000), "run_id": RUN_ID,
                        "trajectory_id": trajectory_id, "group_id": group_id, "turn_index": last_assistant, "call_id": c["id"],
                        "tool_name": c["name"], "arguments_json": c["arguments_json"], "status": "ok", "result_text": turn.get("result", ""),
                        "latency_ms": 1.0, "reward": 0.0, "metrics": [],
                    })
            send("TrajectoryCompleted", group_id, {
                "event_id": event_id(trajectory_id, "completed"), "time_ms": int(time.time() * 1000),
                "trajectory": {
                    "run_id": RUN_ID, "trajectory_id": trajectory_id, "group_id": group_id, "sample_index": k,
                    "group_size": len(episodes), "agent_name": "python", "data_source": ep["data_source"], "dataset": dataset,
                    "ground_truth": ep["ground_truth"], "extra_info_json": extra, "prompt_ids": ep["prompt_ids"],
                    "response_ids": response_ids, "response_mask": mask, "response_logprobs": logprobs,
                    "response_policy_versions": versions, "turn_offsets": offsets, "turn_roles": roles,
                    "response_text": text, "num_turns": len(roles), "num_tool_calls": num_tool_calls, "num_tool_errors": 0,
                    "num_invalid_tool_calls": 0, "tool_rewards": [], "interaction_rewards": [], "termination": "stop",
                    "min_policy_version": POLICY_VERSION, "max_policy_version": POLICY_VERSION, "started_ms": now,
                    "completed_ms": int(time.time() * 1000), "generation_ms": 2.0, "tool_ms": 1.0,
                },
            })
    producer.flush(60)
    if errors:
        sys.exit(f"delivery failed: {errors[:3]}")
    json.dump({"sent": sent}, sys.stdout)


if __name__ == "__main__":
    main()
