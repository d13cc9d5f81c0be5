# Stages fetch_corpus and fetch_weights, and on the cpu backend the fixture checkpoint that stands in
# for the published weights.


# The training corpus: c4_test downloaded at a pinned commit, or the local file in data.path, less every
# data.heldout_every-th document, which goes to the held-out split only the convergence stage reads. A few MB,
# fetched where Snakemake runs (a cluster's compute nodes often reach no internet), never as a cluster job.
localrules:
    fetch_corpus,


rule fetch_corpus:
    input:
        get_corpus_source(),
    output:
        corpus=directory("results/fetch_corpus/c4_test"),
        heldout=directory("results/fetch_corpus/heldout"),
        summary="results/fetch_corpus/summary.json",
    log:
        "logs/fetch_corpus/fetch_corpus.log",
    benchmark:
        "benchmarks/fetch_corpus.tsv"
    conda:
        SOFTWARE_ENV
    params:
        code=get_code("fetch_corpus.py"),
        data=config["data"],
        backend=BACKEND,
    script:
        "../scripts/fetch_corpus.py"


# cpu backend: a tokenizer trained on the corpus and a tiny Qwen3 briefly pretrained on it, published
# into an offline hub cache. No pin stamps as inputs: like weights on the hub, it is remade only when
# its own config or the corpus changes, so a package bump does not cascade through every stage.
rule fixture_checkpoint:
    input:
        corpus="results/fetch_corpus/c4_test",
        corpus_summary="results/fetch_corpus/summary.json",
    output:
        fixture=directory("results/fixture_checkpoint/fixture"),
        summary="results/fixture_checkpoint/summary.json",
    log:
        "logs/fixture_checkpoint/fixture_checkpoint.log",
    benchmark:
        "benchmarks/fixture_checkpoint.tsv"
    conda:
        SOFTWARE_ENV
    resources:
        **get_small_resources(),
    params:
        code=get_code("fixture_checkpoint.py"),
        fixture=config["fixture"],
        repo_id=config["weights"]["repo_id"],
        revision=config["weights"]["revision"],
        backend=BACKEND,
    script:
        "../scripts/fixture_checkpoint.py"


# The checkpoint both recipes start from, through huggingface_hub, checked file by file. A Snakemake
# checkpoint: its consumers are planned again once it has run, on its manifest's bytes (get_fetched_weights),
# so a refetch that changes no byte stops here.
checkpoint fetch_weights:
    input:
        pin_stamps("huggingface-hub", "safetensors"),
        get_weights_source(),
    output:
        checkpoint=directory("results/fetch_weights/checkpoint"),
        manifest="results/fetch_weights/manifest.json",
        summary="results/fetch_weights/summary.json",
    log:
        "logs/fetch_weights/fetch_weights.log",
    benchmark:
        "benchmarks/fetch_weights.tsv"
    conda:
        SOFTWARE_ENV
    resources:
        **get_small_resources(),
    params:
        code=get_code("fetch_weights.py"),
        weights=config["weights"],
        cache_dir=get_weights_cache(),
        offline=USES_FIXTURE,
        backend=BACKEND,
    script:
        "../scripts/fetch_weights.py"
