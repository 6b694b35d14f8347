"""A tool-calling agent as a user would write it with the official `openai` package, pointed at `rlstream serve`.

For each problem it asks for n samples of the prompt (one group), then drives each sample's conversation: the
model calls the calculator, the agent runs it and sends the result back, until the model answers or the turn
limit is reached. Each trajectory is then completed: the first half of the groups with no reward (the reward
consumer scores them from the task's ground truth), the rest with a reward the agent computes itself.
Prints one JSON object: what every trajectory was served (token ids per assistant turn) and how it ended.

Environment: RLSTREAM_URL, RLSTREAM_TOKEN, RLSTREAM_MODEL, RLSTREAM_PROBLEMS (JSON list of {question, answer}),
RLSTREAM_N (samples per problem), RLSTREAM_MAX_TURNS.
"""

import json
import os
import re
import sys
import urllib.request

from openai import OpenAI

from calc import calculate  # test/serve/calc.py, beside this script

URL = os.environ["RLSTREAM_URL"]
TOKEN = os.environ["RLSTREAM_TOKEN"]
MODEL = os.environ["RLSTREAM_MODEL"]
PROBLEMS = json.loads(os.environ["RLSTREAM_PROBLEMS"])
N = int(os.environ.get("RLSTREAM_N", "2"))
MAX_TURNS = int(os.environ.get("RLSTREAM_MAX_TURNS", "3"))

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Exact arithmetic.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
                "additionalProperties": False,
            },
        },
    }
]

def calculator(arguments):
    try:
        expression = json.loads(arguments)["expression"]
    except Exception as err:  # the model reads the error, as with any tool
        return f"Error: {err}"
    return calculate(expression)


def complete(trajectory_id, body):
    request = urllib.request.Request(
        f"{URL}/v1/trajectories/{trajectory_id}/complete",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request) as response:
        return json.loads(response.read())


def main():
    client = OpenAI(base_url=f"{URL}/v1", api_key=TOKEN, max_retries=0)
    out = []
    for index, problem in enumerate(PROBLEMS):
        prompt = [
            {"role": "system", "content": "Use the calculator, then answer."},
            {"role": "user", "content": problem["question"]},
        ]
        first = client.chat.completions.create(
            model=MODEL,
            messages=prompt,
            tools=TOOLS,
            n=N,
            temperature=1.0,
            logprobs=True,
            metadata={"ground_truth": str(problem["answer"]), "data_source": "rlstream/calculator"},
        )
        for choice in first.choices:
            ext = choice.model_extra["rlstream"]
            trajectory_id = ext["trajectory_id"]
            served = [ext["token_ids"]]
            logprobs = [[t.logprob for t in choice.logprobs.content]]
            conversation = prompt + [choice.message.model_dump(exclude_none=True)]
            completed = ext["completed"]
            turns = 1
            while choice.message.tool_calls and completed is None and turns < MAX_TURNS:
                for call in choice.message.tool_calls:
                    conversation.append({"role": "tool", "tool_call_id": call.id, "content": calculator(call.function.arguments)})
                response = client.chat.completions.create(
                    model=MODEL,
                    messages=conversation,
                    tools=TOOLS,
                    temperature=1.0,
                    logprobs=True,
                    extra_headers={"X-Rlstream-Trajectory": trajectory_id},
                )
                choice = response.choices[0]
                ext = choice.model_extra["rlstream"]
                assert ext["trajectory_id"] == trajectory_id, "the endpoint answered another trajectory"
                served.append(ext["token_ids"])
                logprobs.append([t.logprob for t in choice.logprobs.content] if choice.logprobs else [])
                conversation.append(choice.message.model_dump(exclude_none=True))
                completed = ext["completed"]
                turns += 1
            answer = choice.message.content or ""
            own_reward = index >= len(PROBLEMS) // 2
            if completed is None:
                match = re.search(r"answer is\s*(-?\d+)", answer)
                reward = 1.0 if match and match.group(1) == str(problem["answer"]) else 0.0
                summary = complete(trajectory_id, {"reward": reward} if own_reward else {})
                completed = summary["termination"]
                mismatches = summary["tokenization_mismatches"]
            else:
                reward, mismatches = None, None
            out.append(
                {
                    "trajectory_id": trajectory_id,
                    "group_id": ext["group_id"],
                    "served": served,
                    "logprobs": logprobs,
                    "termination": completed,
                    "own_reward": reward if own_reward else None,
                    "tokenization_mismatches": mismatches,
                }
            )
    json.dump({"trajectories": out}, sys.stdout)


if __name__ == "__main__":
    main()
