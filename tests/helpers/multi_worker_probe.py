"""One worker process of tests/train/test_distribution.py's 2-worker runs.

    TF_CONFIG='{"cluster": ..., "task": ...}' \
        python tests/helpers/multi_worker_probe.py OUT.npz <python -m lealla_tf.train flags>

Builds MultiWorkerMirroredStrategy from TF_CONFIG (first, as collective ops
require) and the config from the training command's own flags, records this
worker's view of the first step (its initial weights, its share of the first
global batch, the all-reduced loss and gradients), then trains exactly as
`python -m lealla_tf.train --strategy=multi_worker` does and records where it
ended (weights, steps, its temporary write directory).
"""

import json
import sys


def flatten(batch: dict, prefix: str = ""):
    """(path, tensor) of a nested batch dict, in a fixed order."""
    for key in sorted(batch):
        if isinstance(batch[key], dict):
            yield from flatten(batch[key], f"{prefix}{key}/")
        else:
            yield prefix + key, batch[key]


def main(out: str, argv) -> None:
    from lealla_tf.train.distribution import make_strategy

    strategy = make_strategy("multi_worker")

    import numpy as np
    import tensorflow as tf

    from lealla_tf.cli.train import build_parser, config_from_flags
    from lealla_tf.train.launch import build_trainer

    args = build_parser().parse_args(argv)
    trainer = build_trainer(config_from_flags(args), args.model_dir, args.vocab_file, strategy,
                            progress=False)
    task = trainer.task
    record = {f"initial/{i}": v.numpy() for i, v in enumerate(task.trainable)}
    batch = next(iter(task.distributed_dataset(0)))
    _, total, gradients = strategy.run(tf.function(task.replica_gradients), args=(batch,))

    def local(value):
        return strategy.experimental_local_results(value)[0].numpy()

    record["total"] = strategy.reduce(tf.distribute.ReduceOp.SUM, total, axis=None).numpy()
    record.update({f"gradient/{i}": local(g) for i, g in enumerate(gradients)})
    record.update({f"batch/{path}": local(value) for path, value in flatten(batch)})
    summary = trainer.train()
    record.update({f"final/{i}": v.numpy() for i, v in enumerate(task.trainable)})
    record["summary"] = np.array(json.dumps(summary, default=str))
    record["write_dir"] = np.array(trainer.write_dir)
    np.savez(out, **record)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
