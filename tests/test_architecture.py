"""The package's import graph: no cycle, no upward edge, CLIs only at the top.

Edges come from every `import` in the source, function-level ones included, so a
lazy import cannot hide a dependency.
"""

import ast
import collections
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "lealla_tf"

# Lower layers never import higher ones. Command-line modules are the top layer.
LAYERS = [
    {"losses", "mining", "tokenizer", "parallel_corpus", "embedding_io", "sentencepiece_model",
     "e5_checkpoint", "distribution", "beam_options", "reload_check", "layers",
     "layers.l2_normalization", "layers.masked_mean_pooling", "layers.hash_dropout",
     "layers.saved_model_layer", "pipelines", "json_files", "machine", "kernels", "progress"},
    {"objectives", "configs", "presets", "lealla_encoder", "vocabulary", "flags", "schedules",
     "optimizers"},
    {"model_dir", "data", "checkpoint_conversion", "vocab_pruning"},
    {"export_lib", "embedder", "teachers", "students"},
    {"teacher_conversion", "evaluation", "embedding_init", "plots", "heads"},
    {"run_logs", "news_set"},
    {"task", "trainer", "pipelines.embed_corpus", "pipelines.mine_bitext"},
    {"training"},
    {"train", "evaluate", "vocab", "recipe", "kernels.__main__"},
]
COMMAND_LINES = {"train", "evaluate", "vocab", "recipe", "kernels.__main__"}


def import_graph():
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    edges = collections.defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for target in targets:
                if target.startswith("lealla_tf."):
                    target = target[len("lealla_tf."):]
                    if target in modules and target != name:
                        edges[name].add(target)
    return modules, edges


def test_every_module_has_a_layer():
    modules, _ = import_graph()
    layered = set().union(*LAYERS)
    assert set(modules) - {""} == layered, set(modules) ^ layered


def test_no_upward_edge():
    _, edges = import_graph()
    layer = {name: i for i, names in enumerate(LAYERS) for name in names}
    upward = [f"{a} (layer {layer[a]}) -> {b} (layer {layer[b]})"
              for a, targets in edges.items() for b in targets if layer[b] > layer[a]]
    assert not upward, upward


def test_no_cycle():
    _, edges = import_graph()
    state = {}

    def visit(node, path):
        state[node] = "open"
        for target in edges.get(node, ()):
            if state.get(target) == "open":
                raise AssertionError("import cycle: " + " -> ".join(path + [node, target]))
            if target not in state:
                visit(target, path + [node])
        state[node] = "done"

    for node in list(edges):
        if node not in state:
            visit(node, [])


def test_library_modules_never_import_a_command_line():
    _, edges = import_graph()
    offenders = [(a, b) for a, targets in edges.items() for b in targets
                 if b in COMMAND_LINES and a not in COMMAND_LINES]
    assert not offenders, offenders
