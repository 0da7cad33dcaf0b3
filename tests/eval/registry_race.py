"""The worker of test_eval_registry's concurrent-adds race, in a module of its own: a spawned worker imports the
module its function comes from, and this one needs only the registry (no torch, no model: seconds less per
worker than importing the test module)."""
from tinystack.eval.registry import ModelRegistry


def add_versions(args):
    root, src, n = args
    reg = ModelRegistry(root)
    return [reg.add("race", src, {}) for _ in range(n)]
