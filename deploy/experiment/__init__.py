"""Experiment configurations for this cluster: `new` writes one, `lint` checks one.

    python -m deploy experiment new --cluster FILE [--slots N] [--nvlink-slots N]
                                    [--example core-api|fairness] [--out DIR]
    python -m deploy experiment lint --cluster FILE [--nvlink-slots N] [--strict]
                                     EXPERIMENT_YAML [MODEL_DIR]

(`python -m deploy.experiment new|lint ...` is an alias of these, for one release.)

    target.py     what this cluster gives an experiment: bucket, endpoint, images, slot limits
    template.py   the experiment YAML and the example Core API model `new` writes
    fairness.py   `new --example fairness`: a classifier that reports per-group gaps and can pause
    schema.py     Determined 0.38.0's own schemas (schemas/, copied from its repository)
    lint.py       the schema plus this cluster's rules; code.py the model directory's rules
    smoke.py      the smoke experiments `python -m deploy verify` submits (trial: smoke_model/)
    __main__.py   the command line

docs/experiments.md describes the template and every rule with the pitfall it prevents.
"""
