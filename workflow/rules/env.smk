# Stage pin_env: the installed versions against workflow/envs/<backend>.txt.


# One stamp per pinned package. Its params hold only that package's pin and installed version, so
# bumping one pin re-runs this rule for that package alone, and only the stages that use its stamp.
# The installed version is read when the workflow is parsed: no cluster job needed for the stamp.
localrules:
    pin_package,


rule pin_package:
    input:
        git_head=get_git_head,
    output:
        "results/pin_env/packages/{package}.json",
    log:
        "logs/pin_env/{package}.log",
    wildcard_constraints:
        package="[a-z0-9._-]+",
    conda:
        SOFTWARE_ENV
    params:
        code=get_code("pin_package.py"),
        pinned=get_pin,
        installed=get_installed,
        source=get_source,
    script:
        "../scripts/pin_package.py"


# One stamp per OS package of the Neuron SDK release (driver, runtime, collectives, tools), on an instance (the
# packages are the instance's, not the login node's): the release's version against the installed one. Its
# params hold that package's release version only, so switching the release reruns the stamps of the packages
# that moved, and the stages that run on them.
rule pin_os_package:
    output:
        "results/pin_env/os_packages/{package}.json",
    log:
        "logs/pin_env/os_packages/{package}.log",
    wildcard_constraints:
        package="[a-z0-9._-]+",
    conda:
        SOFTWARE_ENV
    resources:
        **get_instance_resources(nodes=1),
    params:
        code=get_code("pin_os_package.py"),
        pinned=get_os_pin,
        installed=get_os_installed,
    script:
        "../scripts/pin_os_package.py"


# The whole environment for the report: every pin, Python, the platform and, on neuron, the driver,
# runtime and compiler versions.
rule pin_env:
    input:
        stamps=pin_stamps(*sorted(PINS), *sorted(OS_PINS)),
        # A new lock reruns pin_env and the report only: the stages take the per-package stamps.
        lock=get_lock_file(),
    output:
        summary="results/pin_env/summary.json",
    log:
        "logs/pin_env/summary.log",
    benchmark:
        "benchmarks/pin_env.tsv"
    conda:
        SOFTWARE_ENV
    resources:
        **get_instance_resources(nodes=1),
    params:
        code=get_code("pin_env.py"),
        backend=get_backend_config(),
        pins_file=PINS_FILE,
        sdk_release=get_sdk_release(),
    script:
        "../scripts/pin_env.py"
