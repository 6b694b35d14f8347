"""Agents written with real frameworks from PyPI, pointed at `rlstream serve` with only a base URL and a key.

FRAMEWORK picks one: `openai` (the official client in a plain tool loop), `langgraph` (LangGraph's prebuilt ReAct
agent on langchain-openai's ChatOpenAI) or `agents` (the OpenAI Agents SDK on its Chat Completions model). Each
problem is one conversation; nothing names a trajectory or a group (no header, no metadata). The only rlstream
specific lines are the response hook that reads which trajectory served each call (X-Rlstream-Trajectory, so the
test can check that a conversation is exactly one trajectory) and the completion of that trajectory with the
problem's ground truth, after the conversation.
Prints one JSON object: per conversation, the trajectory id of each model call and how the trajectory ended.

Environment: RLSTREAM_URL, RLSTREAM_TOKEN, RLSTREAM_MODEL, RLSTREAM_PROBLEMS (JSON list of {question, answer}),
RLSTREAM_MAX_TURNS, FRAMEWORK.
"""

import json
import os
import sys
import urllib.error
import urllib.request

import httpx

from calc import calculate  # test/serve/calc.py, beside this script

URL = os.environ["RLSTREAM_URL"]
TOKEN = os.environ["RLSTREAM_TOKEN"]
MODEL = os.environ["RLSTREAM_MODEL"]
PROBLEMS = json.loads(os.environ["RLSTREAM_PROBLEMS"])
MAX_TURNS = int(os.environ.get("RLSTREAM_MAX_TURNS", "3"))
FRAMEWORK = os.environ["FRAMEWORK"]
SYSTEM = "Use the calculator, then answer."

# Which trajectory served each call of the current conversation (read from the response headers).
served = []


def on_response(response):
    served.append(response.headers.get("x-rlstream-trajectory"))


async def on_response_async(response):
    on_response(response)


def complete(trajectory_id, body):
    request = urllib.request.Request(
        f"{URL}/v1/trajectories/{trajectory_id}/complete",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request) as response:
            return json.loads(response.read())["termination"]
    except urllib.error.HTTPError as err:  # 409: it ended on its own (response budget spent)
        return json.loads(err.read())["error"]["message"]


def run_openai(question):
    from openai import OpenAI

    client = OpenAI(base_url=f"{URL}/v1", api_key=TOKEN, max_retries=0, http_client=httpx.Client(event_hooks={"response": [on_response]}))
    tools = [{"type": "function", "function": {"name": "calculator", "description": "Exact arithmetic.", "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    for _ in range(MAX_TURNS):
        message = client.chat.completions.create(model=MODEL, messages=messages, tools=tools).choices[0].message
        messages.append(message.model_dump(exclude_none=True, exclude={"rlstream"}))
        if not message.tool_calls:
            return
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(json.loads(call.function.arguments).get("expression", ""))})


def run_langgraph(question):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.errors import GraphRecursionError
    from langgraph.prebuilt import create_react_agent

    @tool
    def calculator(expression: str) -> str:
        """Exact arithmetic."""
        return calculate(expression)

    llm = ChatOpenAI(model=MODEL, base_url=f"{URL}/v1", api_key=TOKEN, max_retries=0, http_client=httpx.Client(event_hooks={"response": [on_response]}))
    agent = create_react_agent(llm, [calculator], prompt=SYSTEM)
    try:
        agent.invoke({"messages": [("user", question)]}, {"recursion_limit": 2 * MAX_TURNS})
    except GraphRecursionError:
        pass


def run_agents(question):
    from agents import Agent, MaxTurnsExceeded, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # traces go to OpenAI's servers otherwise

    @function_tool
    def calculator(expression: str) -> str:
        """Exact arithmetic."""
        return calculate(expression)

    client = AsyncOpenAI(base_url=f"{URL}/v1", api_key=TOKEN, max_retries=0, http_client=httpx.AsyncClient(event_hooks={"response": [on_response_async]}))
    agent = Agent(name="calculator", instructions=SYSTEM, tools=[calculator], model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client))
    try:
        Runner.run_sync(agent, question, max_turns=MAX_TURNS)
    except MaxTurnsExceeded:
        pass


def main():
    run = {"openai": run_openai, "langgraph": run_langgraph, "agents": run_agents}[FRAMEWORK]
    out = []
    for problem in PROBLEMS:
        served.clear()
        run(problem["question"])
        calls = list(served)
        ids = sorted(set(calls))
        termination = complete(ids[0], {"ground_truth": str(problem["answer"])}) if len(ids) == 1 and ids[0] else None
        out.append({"calls": calls, "termination": termination})
    json.dump({"conversations": out}, sys.stdout)


if __name__ == "__main__":
    main()
