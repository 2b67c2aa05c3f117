"""Evaluating models: lm-evaluation-harness on runs, folders, hub ids and model objects; classifier reports.

Start reading at ``harness.py`` (``evaluate``: what ``workbench.evaluate`` and ``workbench
evaluate`` run):

    targets.py     what to evaluate: a run (its final or best model; the merged model when up to
                   date), a model or adapter folder, a hub id (refused offline when not cached),
                   a model object; where its results go
    tasks.py       which tasks: the harness's own (their cached datasets checked offline), local
                   task YAMLs (include_path), and ``heldout`` made from the run's held-out split
    harness.py     lm_eval.simple_evaluate with its command line's defaults, per model
    classifier.py  a classifier on a labelled file: accuracy, F1, the confusion matrix
    results.py     EvaluationResult (the side-by-side table) and the files in <run>/evaluation/
    progress.py    the harness's bars as events, and their console view
    cli.py         ``workbench evaluate MODEL... --tasks ...``

Imports: ``workbench.config``, ``errors``, ``sources`` (data, the hub switch), ``tasks`` (the
chat rows of a causal-LM run, the classification metrics), ``engine.benchmarks`` (the results
files' layout) and ``shipping.card`` (the card rewritten with the scores). Never a view: the
notebook bar is ``workbench.widgets.evaluation``, attached by ``workbench.frontend``. The engine
never imports this package.
"""
