"""Checks of the Triton kernels' sources that the interpreter cannot make: it calls a plain Python function from a
kernel as if it were jitted, where the compiler refuses it ("Unsupported function referenced")."""

from __future__ import annotations

import ast
import pathlib

import speechkernels

PACKAGE = pathlib.Path(speechkernels.__file__).parent


def _jitted(node: ast.FunctionDef) -> bool:
    return any(ast.unparse(d).split("(")[0] in ("triton.jit", "jit") for d in node.decorator_list)


def test_kernels_call_only_jitted_functions_of_their_module():
    checked, bad = 0, []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        for fn in functions.values():
            if not _jitted(fn):
                continue
            checked += 1
            for call in ast.walk(fn):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
                    callee = functions.get(call.func.id)
                    if callee is not None and not _jitted(callee):
                        bad.append(f"{path.relative_to(PACKAGE)}: {fn.name} calls {callee.name}, not @triton.jit")
    assert checked > 50  # the scan found the kernels
    assert not bad, bad
