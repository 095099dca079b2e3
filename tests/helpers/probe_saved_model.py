"""Loads an exported SavedModel in a FRESH process and records what it computes.

Run by the export tests as a subprocess, so no Python state is shared with the
exporter. Only `import tensorflow_text` (plus the loader's own library) comes
before loading, as a user would do.

    python probe_saved_model.py --loader=hub_keras_layer|tfsm_layer|saved_model_load \
        --format=lealla|labse --path=... --sentences=sentences.json --output=out.npz
"""

import argparse
import base64
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--loader", required=True)
    parser.add_argument("--format", required=True)
    parser.add_argument("--path", required=True)
    parser.add_argument("--sentences", required=True)
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    if args.loader == "hub_keras_layer":
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import numpy as np
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    with open(args.sentences) as f:
        sentences = [base64.b64decode(s) for s in json.load(f)]
    batch = tf.constant(sentences)
    results = {}

    if args.loader == "hub_keras_layer":
        import tensorflow_hub as hub
        import tf_keras

        if args.format == "lealla":
            layer = hub.KerasLayer(args.path, trainable=True)
            text = tf_keras.Input(shape=(), dtype=tf.string)
            model = tf_keras.Model(text, layer(text))
            results["batch"] = model.predict(batch, batch_size=len(sentences), verbose=0)
            embed = lambda x, training: layer(x, training=training)  # noqa: E731
        else:
            preprocessor = hub.KerasLayer(os.path.join(args.path, "preprocessor"))
            layer = hub.KerasLayer(os.path.join(args.path, "encoder"), trainable=True)
            text = tf_keras.Input(shape=(), dtype=tf.string)
            outputs = layer(preprocessor(text))
            model = tf_keras.Model(text, outputs["default"])
            results["batch"] = model.predict(batch, batch_size=len(sentences), verbose=0)
            embed = lambda x, training: layer(preprocessor(x), training=training)["default"]  # noqa
        results["training_false"] = embed(batch, False).numpy()
        results["training_a"] = embed(batch, True).numpy()
        results["training_b"] = embed(batch, True).numpy()
        weights = layer.trainable_weights
    elif args.loader == "tfsm_layer":
        import keras

        if args.format != "lealla":
            raise SystemExit("tfsm_layer probe is for the lealla format")
        layer = keras.layers.TFSMLayer(args.path, call_endpoint="serving_default")
        results["batch"] = layer(batch)["default"].numpy()
        weights = layer.weights
    else:
        if args.format == "lealla":
            model = tf.saved_model.load(args.path)
            embed = lambda x, training: model(x, training=training)  # noqa: E731
            results["signature"] = model.signatures["serving_default"](inputs=batch)[
                "default"].numpy()
            weights = model.trainable_variables
            results["variables_count"] = np.array(len(model.variables))
        else:
            preprocessor = tf.saved_model.load(os.path.join(args.path, "preprocessor"))
            encoder = tf.saved_model.load(os.path.join(args.path, "encoder"))
            embed = lambda x, training: encoder(preprocessor(x), training=training)[  # noqa
                "default"]
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
        results[f"weight_{i:04d}"] = np.asarray(weight.numpy())
    np.savez(args.output, **results)


if __name__ == "__main__":
    main()
