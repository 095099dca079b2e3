r"""The reload check: load an exported SavedModel in a FRESH process and record what it computes.

`reload_in_fresh_process(path, sentences)` runs this module as a subprocess, so no
Python state is shared with the exporter, and returns its arrays; the export
tests and the main job's export stage both use it. Only `import tensorflow_text`
(plus the loader's own library) comes before loading, as a user would do.

    python -m lealla_tf.inference.reload_check \
        --loader=hub_keras_layer|tfsm_layer|keras3_layer|saved_model_load \
        --format=lealla|labse --path=... --sentences=sentences.json --output=out.npz \
        [--only_batch]

The child imports TensorFlow and the loader's library inside `main`, after it has
chosen Keras 2 or 3 for that loader (`TF_USE_LEGACY_KERAS`), as a user's fresh
process would; so no import of this module loads TensorFlow.
"""

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

LOADERS = ("hub_keras_layer", "tfsm_layer", "keras3_layer", "saved_model_load")


def reload_in_fresh_process(path: str, sentences, loader: str = "hub_keras_layer",
                            export_format: str = "lealla", timeout: int = 600,
                            only_batch: bool = False) -> dict:
    """Loads `path` with `loader` in a new Python process and embeds `sentences`.

    Returns the arrays the check recorded ("batch": the embeddings of all
    sentences in one call, plus loader-specific ones: dropout with training=True,
    one sentence at a time, the weights, a fit through the layer). With
    `only_batch`, the child loads the model as a user would, records "batch"
    and stops: the main job's check, which compares only those embeddings and
    would otherwise spend most of the check's time on the rest. RuntimeError
    with the child's stderr when loading fails.
    """
    if loader not in LOADERS:
        raise ValueError(f"loader must be one of {LOADERS}, got {loader!r}")
    if only_batch and (loader, export_format) != ("hub_keras_layer", "lealla"):
        raise ValueError("only_batch is the hub_keras_layer check of a lealla export")
    encoded = [base64.b64encode(s if isinstance(s, bytes) else s.encode("utf-8")).decode()
               for s in sentences]
    with tempfile.TemporaryDirectory() as work:
        sentences_file = os.path.join(work, "sentences.json")
        output = os.path.join(work, "output.npz")
        with open(sentences_file, "w") as f:
            json.dump(encoded, f)
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="-1")
        env.pop("TF_USE_LEGACY_KERAS", None)
        result = subprocess.run(
            [sys.executable, "-m", "lealla_tf.inference.reload_check", f"--loader={loader}",
             f"--format={export_format}", f"--path={path}", f"--sentences={sentences_file}",
             f"--output={output}"] + (["--only_batch"] if only_batch else []),
            capture_output=True, text=True, env=env, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"{loader} could not reload {path} in a fresh process:\n"
                               f"{result.stderr[-4000:]}")
        return dict(np.load(output))


def fit_changes(model, layer, batch, loss):
    """Fits `model` (strings -> 2 logits) with `loss` for two epochs on `batch`
    and returns how many of `layer`'s trainable weights changed."""
    import tensorflow as tf  # noqa: PLC0415 - after the loader's Keras is chosen (see main)

    model.compile(optimizer="adam", loss=loss)
    before = [np.array(w.numpy()) for w in layer.trainable_weights]
    labels = tf.constant([i % 2 for i in range(int(batch.shape[0]))])
    # fit never shuffles a Dataset; saying so keeps Keras 3's warning that it ignores shuffle
    model.fit(tf.data.Dataset.from_tensor_slices((batch, labels)).batch(4), epochs=2,
              shuffle=False, verbose=0)
    return np.array(sum(not np.array_equal(b, np.array(w.numpy()))
                        for b, w in zip(before, layer.trainable_weights)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--loader", required=True)
    parser.add_argument("--format", required=True)
    parser.add_argument("--path", required=True)
    parser.add_argument("--sentences", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--only_batch", action="store_true",
                        help="record the batch embeddings only, then stop (hub_keras_layer, "
                        "lealla format)")
    args = parser.parse_args()
    if args.loader == "hub_keras_layer":
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    # Each import below comes after that choice, as in a user's fresh process.
    import tensorflow as tf  # noqa: PLC0415 - after TF_USE_LEGACY_KERAS is set
    import tensorflow_text  # noqa: F401, PLC0415 - the exports' text ops, as a user imports them

    with open(args.sentences) as f:
        sentences = [base64.b64decode(s) for s in json.load(f)]
    batch = tf.constant(sentences)
    results = {}

    if args.loader == "hub_keras_layer":
        import tensorflow_hub as hub  # noqa: PLC0415 - this loader's library, after the choice
        import tf_keras  # noqa: PLC0415 - Keras 2, after TF_USE_LEGACY_KERAS is set

        if args.format == "lealla":
            layer = hub.KerasLayer(args.path, trainable=True)
            text = tf_keras.Input(shape=(), dtype=tf.string)
            model = tf_keras.Model(text, layer(text))
            results["batch"] = model.predict(batch, batch_size=len(sentences), verbose=0)
            if args.only_batch:
                np.savez(args.output, **results)
                return

            def embed(x, training):
                return layer(x, training=training)
        else:
            preprocessor = hub.KerasLayer(os.path.join(args.path, "preprocessor"))
            layer = hub.KerasLayer(os.path.join(args.path, "encoder"), trainable=True)
            text = tf_keras.Input(shape=(), dtype=tf.string)
            outputs = layer(preprocessor(text))
            model = tf_keras.Model(text, outputs["default"])
            results["batch"] = model.predict(batch, batch_size=len(sentences), verbose=0)

            def embed(x, training):
                return layer(preprocessor(x), training=training)["default"]
        results["training_false"] = embed(batch, False).numpy()
        results["training_a"] = embed(batch, True).numpy()
        results["training_b"] = embed(batch, True).numpy()
        weights = layer.trainable_weights
        if args.format == "lealla":  # inside tf.keras.Sequential, trained by fit
            trained = hub.KerasLayer(args.path, trainable=True)  # the weights above stay
            results["fit_changed"] = fit_changes(
                tf.keras.Sequential([trained, tf.keras.layers.Dense(2)]), trained, batch,
                tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    elif args.loader == "keras3_layer":
        import keras  # noqa: PLC0415 - Keras 3, after the choice

        from lealla_tf.inference.saved_model_layer import (  # noqa: PLC0415 - imports Keras
            LeallaSavedModelLayer,
        )

        layer = LeallaSavedModelLayer(args.path, trainable=True)
        text = keras.Input(shape=(), dtype="string")
        model = keras.Model(text, keras.layers.Dense(2)(layer(text)))
        results["batch"] = layer(batch).numpy()
        weights = [np.array(w.numpy()) for w in layer.weights]  # as loaded, before fit
        results["fit_changed"] = fit_changes(
            model, layer, batch, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    elif args.loader == "tfsm_layer":
        import keras  # noqa: PLC0415 - Keras 3, after the choice

        if args.format != "lealla":
            raise SystemExit("tfsm_layer probe is for the lealla format")
        layer = keras.layers.TFSMLayer(args.path, call_endpoint="serving_default")
        results["batch"] = layer(batch)["default"].numpy()
        weights = layer.weights
    else:
        if args.format == "lealla":
            model = tf.saved_model.load(args.path)

            def embed(x, training):
                return model(x, training=training)

            results["signature"] = model.signatures["serving_default"](inputs=batch)[
                "default"].numpy()
            weights = model.trainable_variables
            results["variables_count"] = np.array(len(model.variables))
        else:
            preprocessor = tf.saved_model.load(os.path.join(args.path, "preprocessor"))
            encoder = tf.saved_model.load(os.path.join(args.path, "encoder"))

            def embed(x, training):
                return encoder(preprocessor(x), training=training)["default"]

            packed = preprocessor.bert_pack_inputs([preprocessor.tokenize(batch)])
            results["via_tokenize"] = encoder(packed)["default"].numpy()
            results["do_lower_case"] = np.array(encoder.do_lower_case.numpy())
            outputs = encoder(preprocessor(batch))
            results["encoder_outputs_count"] = np.array(len(outputs["encoder_outputs"]))
            weights = encoder.trainable_variables
        results["batch"] = embed(batch, False).numpy()
        results["single"] = np.concatenate(
            [embed(tf.constant([s]), False).numpy() for s in sentences])
        results["training_a"] = embed(batch, True).numpy()
        results["training_b"] = embed(batch, True).numpy()
    for i, weight in enumerate(weights):
        results[f"weight_{i:04d}"] = np.asarray(weight.numpy() if hasattr(weight, "numpy")
                                                 else weight)
    np.savez(args.output, **results)


if __name__ == "__main__":
    main()
