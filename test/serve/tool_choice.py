"""The official `openai` client (PyPI) asking `rlstream serve` for forced tool calls: tool_choice named and required.

For each problem and each tool choice, one call with the calculator declared (and, for `required` with two tools,
a clock beside it). The client does not retry (max_retries=0), so each call is one request. Prints one JSON
object per call: the tool calls the SDK parsed (name, arguments as the SDK holds them), the rlstream extension,
or the error the SDK raised (its class, status and body).

Environment: RLSTREAM_URL, RLSTREAM_TOKEN, RLSTREAM_MODEL, RLSTREAM_PROBLEMS (JSON list of {question}).
"""

import json
import os

import openai
from openai import OpenAI

URL = os.environ["RLSTREAM_URL"]
client = OpenAI(base_url=f"{URL}/v1", api_key=os.environ["RLSTREAM_TOKEN"], max_retries=0)
MODEL = os.environ["RLSTREAM_MODEL"]
CALCULATOR = {"type": "function", "function": {"name": "calculator", "description": "Exact arithmetic.",
              "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
CLOCK = {"type": "function", "function": {"name": "clock", "description": "The time."}}
CHOICES = [
    ("named", [CALCULATOR], {"type": "function", "function": {"name": "calculator"}}),
    ("required", [CALCULATOR], "required"),
    ("required_two_tools", [CALCULATOR, CLOCK], "required"),
]

for i, problem in enumerate(json.loads(os.environ["RLSTREAM_PROBLEMS"])):
    messages = [{"role": "system", "content": "Use the calculator, then answer."}, {"role": "user", "content": problem["question"]}]
    for label, tools, choice in CHOICES:
        out = {"problem": i, "choice": label}
        try:
            r = client.chat.completions.create(model=MODEL, messages=messages, tools=tools, tool_choice=choice, logprobs=True, seed=i, max_tokens=48)
            c = r.choices[0]
            out["finish_reason"] = c.finish_reason
            out["tool_calls"] = [{"name": t.function.name, "arguments": t.function.arguments} for t in (c.message.tool_calls or [])]
            out["sampled_logprobs"] = len(c.logprobs.content)
            out["rlstream"] = c.model_extra["rlstream"]
        except openai.APIStatusError as e:
            out["error"] = {"class": type(e).__name__, "status": e.status_code, "body": e.body}
        print(json.dumps(out), flush=True)
