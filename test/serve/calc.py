"""The calculator tool of the Python agents in test/serve (agent.py, frameworks.py): arithmetic only, never eval."""

import ast
import operator

OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def evaluate(node):
    """Arithmetic only: numbers, + - * /, unary minus, parentheses (never eval of model output)."""
    if isinstance(node, ast.Expression):
        return evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        return OPS[type(node.op)](evaluate(node.left), evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -evaluate(node.operand)
    raise ValueError("unsupported expression")


def calculate(expression) -> str:
    """The expression's value as the tool answers it, or the error the model reads (as with any tool)."""
    try:
        value = evaluate(ast.parse(str(expression), mode="eval"))
        return str(int(value)) if float(value).is_integer() else str(value)
    except Exception as err:
        return f"Error: {err}"
