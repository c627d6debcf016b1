"""ToolScout: TF-IDF source-style routing in front of tool retrievers (paper: toolscout.md).

One job per module:

- :mod:`toolscout.fingerprint`   d_tfidf(Q, R) for a request, a batch, a rolling window or chunks.
- :mod:`toolscout.router`        the rule d < τ, τ calibration (LOSO, labelled) and the
                                 label-free default τ from held-out reference windows.
- :mod:`toolscout.routerdir`     the ``toolscout-router/1`` directory (fit writes, route reads).
- :mod:`toolscout.outputs`       output-path checks: ``--force`` replaces only its own kind.
- :mod:`toolscout.queries`       reading BEIR-format query files.
- :mod:`toolscout.adapter`       dense retrieval through a trained linear projection
                                 (MNRL + mined hard negatives, JAX/optax); few-shot continuation.
- :mod:`toolscout.reranker`      linear / MLP reranker over retrieval, lexical and metadata features.
- :mod:`toolscout.metrics`       P@1 among covered queries, G = coverage · P@1.
- :mod:`toolscout.proxies`       the other collapse detectors and weighted correlation.
- :mod:`toolscout.classifier`    the TF-IDF source classifier with cross-validation.
- :mod:`toolscout.tooltext`      structured fields parsed back from tool texts.
- :mod:`toolscout.skillcard`     deterministic skill-card rendering (Table 32).
- :mod:`toolscout.sources`       the BFCL + ToolLens multi-source suite (incl. the API-template style).
- :mod:`toolscout.embedding`     the frozen encoder, or a hashing stand-in for smoke tests.
- :mod:`toolscout.routing_eval`  routing on labelled sources: LOSO τ per window size, window accuracy.
- :mod:`toolscout.config`        experiment presets (``tiny``, ``full``) and ``KEY=VALUE`` overrides.
- :mod:`toolscout.keys`          the report's typed keys (retrievers, rerankers, detectors,
                                 routing modes) and their display labels.
- :mod:`toolscout.experiment`    the main experiment end to end, one module per stage (data,
                                 training, evaluation, reranking, detectors, routing, latency,
                                 repair, skill_cards; pipeline runs them, output writes the report).
- :mod:`toolscout.report`        the report as Markdown (``tables``) and one figure (``plots``).
- :mod:`toolscout.cli`           the ``toolscout`` console script (fit, route, experiment).
"""
