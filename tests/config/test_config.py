"""The configuration loader: every key, every class of error, and `yard check`."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from yard import cli
from yard.config import (
    DEFAULT_STARTUP_TIMEOUT_S,
    SERVER_KEYS,
    Config,
    ConfigError,
    JobsConfig,
    load_config,
    parse_listen,
    parse_size,
)
from yard.core.spec import BackendSpec, DeviceSpec, SchedulerConfig

REPO = Path(__file__).resolve().parents[2]

MINIMAL_BACKEND = """
[backends.llm]
models = ["m1"]
command = ["server", "--port", "{port}"]
"""


def write(tmp_path: Path, text: str, name: str = "yard.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def load(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> Config:
    return load_config(write(tmp_path, text), env=env or {})


def errors_of(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text, env)
    return info.value.errors


def test_every_key_of_the_full_example_is_read(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """
        [server]
        listen = "0.0.0.0:9000"
        data_dir = "state"
        admin_key_env = "ADMIN"
        max_body_bytes = "1MiB"
        default_priority = 30
        stop_grace_s = 3
        log_level = "DEBUG"

        [scheduler]
        aging_rate = 2.5
        min_priority = -10
        max_priority = 90
        deadline_boost = 150
        urgency_window_s = 12
        batch_bound = 0
        queue_limit = 7
        profile_margin = 1.25
        default_load_s = 4
        default_service_s = 2
        lost_grace_s = 1.5

        [devices.host]
        reserve = "2GiB"
        [devices.gpu1]
        reserve = 1000
        exclusive = true

        [apps.web]
        key = "k-web"
        default_priority = 40
        max_priority = 60
        [apps.batch]
        key_env = "BATCH_KEY"

        [backends.llm]
        models = ["a", "b"]
        command = ["{python}", "srv", "--port", "{port}", "--host", "{host}", "-m", "{model_file}"]
        env = { X = "{data_dir}/x", Y = "plain" }
        cwd = "work"
        health_path = "/ready"
        startup_timeout_s = 42
        idle_ttl_s = 300
        slots = 3
        gpus = ["gpu1", 2]
        gpu_count = 2
        pinned = true
        api = "openai"
        model_file = "{data_dir}/m.gguf"
        stop_grace_s = 0.5
        [backends.llm.warmup]
        method = "post"
        path = "/v1/completions"
        json = { prompt = "hi", max_tokens = 8 }
        fill_context = true

        [backends.raw]
        api = "plain"
        command = ["raw"]

        [jobs]
        result_ttl_s = 60
        record_ttl_s = 0
        max_result_bytes = "1GiB"
        max_request_bytes = "512KiB"
        reap_interval_s = 2.5
        max_wait_s = 30
        """,
        env={"ADMIN": "admin-secret", "BATCH_KEY": "k-batch"},
    )
    s = config.server
    assert (s.listen_host, s.listen_port) == ("0.0.0.0", 9000)
    assert s.data_dir == tmp_path / "state"
    assert s.admin_key == "admin-secret"
    assert s.max_body_bytes == 2**20
    assert (s.default_priority, s.stop_grace_s, s.log_level) == (30.0, 3.0, "debug")
    assert config.scheduler == SchedulerConfig(
        aging_rate=2.5,
        min_priority=-10,
        max_priority=90,
        deadline_boost=150,
        urgency_window_s=12,
        batch_bound=0,
        queue_limit=7,
        profile_margin=1.25,
        default_load_s=4,
        default_service_s=2,
        lost_grace_s=1.5,
    )
    assert config.devices["host"].reserve_bytes == 2 * 2**30
    assert config.devices["gpu1"].exclusive
    assert config.apps["web"].default_priority == 40
    assert config.apps["web"].max_priority == 60
    # An app without its own figures gets the server default and the scheduler max.
    assert config.apps["batch"].key == "k-batch"
    assert config.apps["batch"].default_priority == 30
    assert config.apps["batch"].max_priority == 90
    llm = config.backends["llm"]
    assert llm.models == ("a", "b")
    assert llm.command[0] == "{python}"
    assert llm.env == {"X": "{data_dir}/x", "Y": "plain"}
    assert llm.cwd == tmp_path / "work"
    assert llm.health_path == "/ready"
    assert (llm.startup_timeout_s, llm.idle_ttl_s, llm.slots) == (42.0, 300.0, 3)
    assert (llm.gpus, llm.gpu_count, llm.pinned, llm.api) == (("gpu1", "gpu2"), 2, True, "openai")
    assert llm.model_file == tmp_path / "state" / "m.gguf"
    assert llm.stop_grace_s == 0.5
    assert llm.warmup is not None
    assert (llm.warmup.method, llm.warmup.path) == ("POST", "/v1/completions")
    assert llm.warmup.json == {"prompt": "hi", "max_tokens": 8}
    assert llm.fill_context is True
    raw = config.backends["raw"]
    assert (raw.api, raw.models, raw.stop_grace_s, raw.health_path) == ("plain", (), 3.0, "/health")
    assert raw.fill_context == "auto"
    assert config.jobs == JobsConfig(
        result_ttl_s=60.0,
        record_ttl_s=0.0,
        max_result_bytes=2**30,
        max_request_bytes=512 * 2**10,
        reap_interval_s=2.5,
        max_wait_s=30.0,
    )


def test_defaults_of_a_minimal_file(tmp_path: Path) -> None:
    config = load(tmp_path, MINIMAL_BACKEND)
    assert (config.server.listen_host, config.server.listen_port) == ("127.0.0.1", 8080)
    assert config.server.data_dir == tmp_path / "data"
    assert config.server.admin_key is None
    assert config.scheduler == SchedulerConfig()
    llm = config.backends["llm"]
    assert (llm.slots, llm.gpus, llm.idle_ttl_s, llm.warmup, llm.cwd) == (1, (), None, None, None)
    assert llm.fill_context == "auto"
    # Without a [jobs] table the job service runs with its own defaults.
    assert config.jobs == JobsConfig()


def test_a_warm_up_table_may_hold_only_the_context_fill_switch(tmp_path: Path) -> None:
    config = load(tmp_path, MINIMAL_BACKEND + "[backends.llm.warmup]\nfill_context = false\n")
    llm = config.backends["llm"]
    assert (llm.warmup, llm.fill_context) == (None, False)


def test_an_empty_file_is_a_valid_config_with_nothing_to_serve(tmp_path: Path) -> None:
    config = load(tmp_path, "")
    assert config.backends == {} and config.apps == {}


def test_unknown_keys_are_errors_with_the_nearest_known_key(tmp_path: Path) -> None:
    errors = errors_of(
        tmp_path,
        """
        [server]
        lisen = "127.0.0.1:1"
        [scheduler]
        aging = 1.0
        [backends.llm]
        models = ["m"]
        command = ["x"]
        idle_ttl = 5
        [extra]
        """,
    )
    path = tmp_path / "yard.toml"
    assert any(f"{path}: server.lisen: unknown key; did you mean 'listen'?" in e for e in errors)
    assert any("scheduler.aging: unknown key; did you mean 'aging_rate'?" in e for e in errors)
    assert any(
        "backends.llm.idle_ttl: unknown key; did you mean 'idle_ttl_s'?" in e for e in errors
    )
    assert any(e.startswith(f"{path}: extra: unknown key") for e in errors)
    assert len(errors) == 4


def test_every_error_is_reported_at_once(tmp_path: Path) -> None:
    errors = errors_of(
        tmp_path,
        """
        [server]
        stop_grace_s = "soon"
        max_body_bytes = "12 parsecs"
        [apps.a]
        key = "same"
        [apps.b]
        key = "same"
        [backends.llm]
        models = ["m"]
        command = ["x", "{prot}"]
        slots = 0
        """,
    )
    assert len(errors) == 5
    joined = "\n".join(errors)
    assert "server.stop_grace_s: must be a number, got a string ('soon')" in joined
    assert "server.max_body_bytes: unknown unit 'parsecs'" in joined
    assert "apps.b.key: the same key is already used by app 'a'" in joined
    assert "backends.llm.command[1]: unknown placeholder {prot}" in joined
    assert "backends.llm.slots: must be at least 1, got 0" in joined


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[server]\nlisten = 8080\n", "server.listen: must be a string, got an integer (8080)"),
        ("[server]\nlisten = 'nohost'\n", "server.listen: expected HOST:PORT"),
        ("[server]\nlisten = '1.2.3.4:99999'\n", "out of range"),
        ("[server]\nlog_level = 'loud'\n", "server.log_level: must be one of debug"),
        ("[server]\ndefault_priority = 500\n", "outside the scheduler's range [0.0, 100.0]"),
        ("[scheduler]\nbatch_bound = 1.5\n", "scheduler.batch_bound: must be an integer"),
        ("[scheduler]\naging_rate = 0\n", "scheduler: aging_rate must be positive"),
        ("[scheduler]\nqueue_limit = true\n", "scheduler.queue_limit: must be an integer, got a b"),
        ("[devices.host]\nreserve = '2 GiBs'\n", "devices.host.reserve: unknown unit 'GiBs'"),
        ("[devices.host]\nreserve = -1\n", "devices.host.reserve: a size cannot be negative"),
        ("[devices.tpu0]\n", "devices.tpu0: devices are called 'host' or 'gpu0'"),
        ("[devices.gpu0]\nexclusive = 'yes'\n", "devices.gpu0.exclusive: must be true or false"),
        ("[apps.a]\ndefault_priority = 1\n", "apps.a: needs key"),
        ("[apps.a]\nkey = 'k'\nmax_priority = 101\n", "apps.a.max_priority: 101.0 is outside"),
        (
            "[apps.a]\nkey = 'k'\nmax_priority = 10\ndefault_priority = 20\n",
            "apps.a.default_priority: 20.0 is above this app's max_priority 10.0",
        ),
        ("[apps.a]\nkey = 'k'\nkey_env = 'K'\n", "apps.a: give either key or key_env, not both"),
        ("[backends.b]\ncommand = ['x']\n", "backends.b.models: is missing"),
        ("[backends.b]\nmodels = []\ncommand = ['x']\n", "backends.b.models: is empty"),
        ("[backends.b]\nmodels = 'm'\ncommand = ['x']\n", "backends.b.models: must be a list"),
        ("[backends.b]\nmodels = ['m']\n", "backends.b.command: is missing"),
        (
            "[backends.b]\nmodels = ['m']\ncommand = 'srv --port {port}'\n",
            'never a shell line; e.g. command = ["srv", "--port", "{port}"]',
        ),
        ("[backends.b]\nmodels = ['m']\ncommand = []\n", "backends.b.command: must not be empty"),
        ("[backends.b]\nmodels = ['m']\ncommand = ['x', '{port']\n", "literal braces"),
        (
            "[backends.b]\nmodels = ['m']\ncommand = ['{model_file}']\n",
            "uses {model_file} but the backend has no model_file",
        ),
        (
            "[backends.b]\nmodels = ['m']\ncommand = ['x']\nenv = { A = '{gpu}' }\n",
            "backends.b.env.A: unknown placeholder {gpu} in '{gpu}'; did you mean {gpus}?",
        ),
        ("[backends.b]\nmodels = ['m']\ncommand = ['x']\nenv = { A = 1 }\n", "env.A: must be a s"),
        ("[backends.b]\nmodels = ['m']\ncommand = ['x']\ncwd = '{port}'\n", "placeholder {port}"),
        ("[backends.b]\nmodels = ['m']\ncommand = ['x']\napi = 'grpc'\n", "must be 'openai'"),
        ("[backends.b]\nmodels = ['m']\ncommand = ['x']\nhealth_path = 'h'\n", "start with '/'"),
        ("[backends.b]\nmodels = ['m']\ncommand = ['x']\nidle_ttl_s = 0\n", "greater than 0"),
        ("[backends.b]\nmodels = ['m']\ncommand = ['x']\ngpus = ['cuda:0']\n", "gpus[0]: must"),
        ("[backends.b]\nmodels = ['m']\ncommand = ['x']\ngpus = [0, 'gpu0']\n", "a GPU twice"),
        ("[backends.b]\nmodels = ['m']\ncommand = ['x']\ngpu_count = 2\n", "gpus is empty"),
        (
            "[backends.b]\nmodels = ['m']\ncommand = ['x']\ngpus = [0]\ngpu_count = 2\n",
            "gpu_count: must be between 1 and the 1 GPUs",
        ),
        (
            "[backends.b]\nmodels = ['m']\ncommand = ['x']\n[backends.b.warmup]\nbody = 1\n",
            "backends.b.warmup.body: unknown key",
        ),
        (
            "[backends.b]\nmodels = ['m']\ncommand = ['x']\n[backends.b.warmup]\nmethod = 'GET'\n",
            "backends.b.warmup.path: is missing",
        ),
        (
            "[backends.b]\nmodels = ['m']\ncommand = ['x']\nwarmup = { fill_context = 'yes' }\n",
            'backends.b.warmup.fill_context: must be true, false or "auto"',
        ),
        ("[backends.'a b']\nmodels = ['m']\ncommand = ['x']\n", "backend names use letters"),
        ("[jobs]\nresult_ttl = 5\n", "jobs.result_ttl: unknown key; did you mean 'result_ttl_s'?"),
        ("[jobs]\nresult_ttl_s = 0\n", "jobs.result_ttl_s: must be greater than 0, got 0.0"),
        ("[jobs]\nrecord_ttl_s = -1\n", "jobs.record_ttl_s: must not be negative"),
        ("[jobs]\nreap_interval_s = 'often'\n", "jobs.reap_interval_s: must be a number"),
        ("[jobs]\nmax_wait_s = -5\n", "jobs.max_wait_s: must not be negative"),
        ("[jobs]\nmax_result_bytes = 0\n", "jobs.max_result_bytes: must be greater than 0"),
        ("[jobs]\nmax_result_bytes = '1 parsec'\n", "jobs.max_result_bytes: unknown unit"),
        ("[jobs]\nmax_request_bytes = 0\n", "jobs.max_request_bytes: must be greater than 0"),
        (
            "[server]\nmax_body_bytes = '1MiB'\n[jobs]\nmax_request_bytes = '2MiB'\n",
            "jobs.max_request_bytes: 2097152 is above server.max_body_bytes (1048576)",
        ),
        ("jobs = []\n", "jobs: must be a table ([jobs]), got a list"),
        ("server = 1\n", "server: must be a table ([server]), got an integer (1)"),
    ],
)
def test_each_class_of_error_names_the_key_and_the_problem(
    tmp_path: Path, text: str, message: str
) -> None:
    errors = errors_of(tmp_path, text)
    assert any(message in e for e in errors), errors
    assert all(e.startswith(f"{tmp_path / 'yard.toml'}: ") for e in errors)


def test_a_model_served_by_two_backends_is_an_error(tmp_path: Path) -> None:
    errors = errors_of(
        tmp_path,
        """
        [backends.one]
        models = ["shared", "a"]
        command = ["x"]
        [backends.two]
        models = ["b", "shared"]
        command = ["y"]
        """,
    )
    assert errors == [
        f"{tmp_path / 'yard.toml'}: backends.two.models: model 'shared' is already served by "
        "backend 'one'; a model name must lead to one backend"
    ]


def test_a_missing_environment_variable_is_named(tmp_path: Path) -> None:
    text = """
    [server]
    admin_key_env = "YARD_ADMIN"
    [apps.a]
    key_env = "APP_A_KEY"
    """
    errors = errors_of(tmp_path, text, env={"YARD_ADMIN": "x"})
    assert errors == [
        f"{tmp_path / 'yard.toml'}: apps.a.key_env: environment variable APP_A_KEY is not set; "
        "export APP_A_KEY=... before starting yard"
    ]
    empty = errors_of(tmp_path, text, env={"YARD_ADMIN": "", "APP_A_KEY": "k"})
    assert empty == [
        f"{tmp_path / 'yard.toml'}: server.admin_key_env: environment variable YARD_ADMIN is empty"
    ]


def test_an_app_key_equal_to_the_admin_key_is_an_error(tmp_path: Path) -> None:
    errors = errors_of(tmp_path, "[server]\nadmin_key = 'k'\n[apps.a]\nkey = 'k'\n")
    assert errors == [
        f"{tmp_path / 'yard.toml'}: apps.a.key: is the same as the admin key; give each its own"
    ]


def test_a_network_address_without_any_key_is_refused(tmp_path: Path) -> None:
    errors = errors_of(tmp_path, "[server]\nlisten = '0.0.0.0:8080'\n")
    assert len(errors) == 1
    assert "server.listen: 0.0.0.0 is reachable from the network but no keys" in errors[0]
    # Loopback needs no key; app keys open the network, and so does an admin
    # key with the keyless data plane asked for explicitly.
    for text in (
        "[server]\nlisten = '[::1]:8080'\n",
        "[server]\nlisten = 'localhost:8080'\n",
        "[server]\nlisten = '0.0.0.0:8080'\nadmin_key = 'a'\nallow_anonymous = true\n",
        "[server]\nlisten = '0.0.0.0:8080'\n[apps.a]\nkey = 'k'\n",
    ):
        load(tmp_path, text)


def test_off_loopback_a_data_plane_without_app_keys_is_refused_unless_asked_for(
    tmp_path: Path,
) -> None:
    errors = errors_of(tmp_path, "[server]\nlisten = '0.0.0.0:8080'\nadmin_key = 'a'\n")
    assert errors == [
        f"{tmp_path / 'yard.toml'}: server.listen: 0.0.0.0 is reachable from the network and "
        "no app has a key, so anybody who can reach it may use every model (the admin key "
        "guards only the admin API); give the apps keys under [apps.NAME], listen on "
        "127.0.0.1, or set server.allow_anonymous = true to serve without keys on purpose"
    ]
    # allow_anonymous does not lift the rule for a yard without any key at all.
    bare = errors_of(tmp_path, "[server]\nlisten = '0.0.0.0:8080'\nallow_anonymous = true\n")
    assert "no keys are configured" in bare[0]
    wrong = errors_of(tmp_path, "[server]\nallow_anonymous = 'yes'\n")
    assert wrong == [
        f"{tmp_path / 'yard.toml'}: server.allow_anonymous: must be true or false, "
        "got a string ('yes')"
    ]
    config = load(tmp_path, "[server]\nadmin_key = 'a'\n")
    with pytest.raises(ConfigError) as info:
        config.with_overrides(listen="0.0.0.0:8080")
    assert info.value.errors[0].startswith("--listen: 0.0.0.0 is reachable from the network and")


def test_check_says_who_may_use_the_data_plane_and_the_admin_api(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = {
        "[server]\nlisten = '0.0.0.0:8080'\nadmin_key = 'a'\nallow_anonymous = true\n": (
            "data plane: NO KEY NEEDED: anybody who can reach 0.0.0.0:8080 may use every model "
            "(server.allow_anonymous = true)",
            "admin API: the admin key required",
        ),
        "[server]\nlisten = '127.0.0.1:8080'\n": (
            "data plane: no key needed, from this machine only (127.0.0.1:8080)",
            "admin API: no key, from this machine only",
        ),
        "[server]\nlisten = '0.0.0.0:8080'\n[apps.a]\nkey = 'k'\n": (
            "data plane: an app key required (1 app(s))",
            "admin API: no key, from this machine only",
        ),
    }
    for text, (data, admin) in cases.items():
        assert cli.main(["check", str(write(tmp_path, text))]) == 0
        out = capsys.readouterr().out
        assert f"  access:   {data}\n  access:   {admin}" in out
    refused = write(tmp_path, "[server]\nlisten = '0.0.0.0:8080'\nadmin_key = 'a'\n")
    assert cli.main(["check", str(refused)]) == 1
    assert "server.allow_anonymous = true" in capsys.readouterr().err


def test_listen_override_keeps_the_loopback_rule(tmp_path: Path) -> None:
    config = load(tmp_path, MINIMAL_BACKEND)
    moved = config.with_overrides(listen="127.0.0.1:0", data_dir=Path("rel"))
    assert (moved.server.listen_host, moved.server.listen_port) == ("127.0.0.1", 0)
    assert moved.server.data_dir == (Path.cwd() / "rel").resolve()
    with pytest.raises(ConfigError) as info:
        config.with_overrides(listen="192.168.1.5:80")
    assert info.value.errors[0].startswith("--listen: 192.168.1.5 is reachable from the network")


def test_data_dir_override_moves_paths_written_with_data_dir(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        MINIMAL_BACKEND
        + 'model_file = "{data_dir}/m.gguf"\ncwd = "{config_dir}/work"\n'
        + '[backends.other]\napi = "plain"\ncommand = ["x"]\nmodel_file = "/abs/o.gguf"\n',
    )
    assert config.backends["llm"].model_file == tmp_path / "data" / "m.gguf"
    moved = config.with_overrides(data_dir=tmp_path / "elsewhere")
    assert moved.backends["llm"].model_file == tmp_path / "elsewhere" / "m.gguf"
    assert moved.backends["llm"].cwd == tmp_path / "work"
    assert moved.backends["other"].model_file == Path("/abs/o.gguf")
    assert moved.backends["llm"].command == config.backends["llm"].command
    with pytest.raises(ConfigError) as info:
        config.with_overrides(listen="192.168.1.5:80")
    assert info.value.errors[0].startswith("--listen: 192.168.1.5 is reachable from the network")


def test_a_missing_file_and_bad_toml_are_reported_with_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.toml", env={})
    assert info.value.errors == [f"{tmp_path / 'nope.toml'}: no such file"]
    with pytest.raises(ConfigError) as info:
        load(tmp_path, "[server\n")
    assert info.value.errors[0].startswith(f"{tmp_path / 'yard.toml'}: not valid TOML: ")
    assert "line 1" in info.value.errors[0]


@pytest.mark.parametrize(
    ("text", "size"),
    [
        (0, 0),
        (123, 123),
        ("2GiB", 2 * 2**30),
        ("512 MiB", 512 * 2**20),
        ("1.5GB", 1_500_000_000),
        ("10kb", 10_000),
        ("7", 7),
        ("3B", 3),
        ("1TiB", 2**40),
    ],
)
def test_sizes_accept_bytes_and_units(text: object, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["", "GiB", "2 GiBs", "-1MiB", True, 1.5, None, -3])
def test_bad_sizes_are_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)


def test_listen_addresses() -> None:
    assert parse_listen("127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert parse_listen("[::1]:9") == ("::1", 9)
    assert parse_listen("localhost:0") == ("localhost", 0)
    with pytest.raises(ValueError):
        parse_listen("127.0.0.1:http")


def test_lookups_by_model_and_key(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        MINIMAL_BACKEND + "[apps.a]\nkey = 'ka'\n[apps.b]\nkey = 'kb'\n",
    )
    backend = config.backend_for_model("m1")
    assert backend is not None and backend.name == "llm"
    assert config.backend_for_model("m2") is None
    app = config.app_for_key("kb")
    assert app is not None and app.name == "b"
    assert config.app_for_key(None) is None
    assert config.app_for_key("") is None
    assert config.app_for_key("nope") is None


def test_specs_for_the_core(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """
        [devices.host]
        reserve = "1GiB"
        [devices.gpu0]
        reserve = "1MiB"
        exclusive = true
        [backends.llm]
        models = ["m"]
        command = ["x"]
        gpus = [0, 1]
        slots = 2
        idle_ttl_s = 9
        pinned = true
        """,
    )
    assert config.backend_specs() == [
        BackendSpec(
            name="llm", gpus=("gpu0", "gpu1"), gpu_count=1, slots=2, idle_ttl_s=9, pinned=True
        )
    ]
    specs = config.device_specs({"host": 8 * 2**30, "gpu0": 2**34, "gpu1": 2**33})
    assert specs == [
        DeviceSpec(name="host", kind="host", total_bytes=8 * 2**30, reserve_bytes=2**30),
        DeviceSpec(name="gpu0", kind="gpu", total_bytes=2**34, reserve_bytes=2**20, exclusive=True),
        DeviceSpec(name="gpu1", kind="gpu", total_bytes=2**33),
    ]
    with pytest.raises(ConfigError) as info:
        config.device_specs({"host": 2**33})
    assert len(info.value.errors) == 3  # devices.gpu0, and gpu0 and gpu1 of the backend
    assert "backends.llm.gpus: gpu1 is not on this machine (seen: host)" in info.value.errors[2]


def test_startup_timeout_is_derived_from_the_measured_load_time(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        MINIMAL_BACKEND + "[backends.fixed]\napi='plain'\ncommand=['x']\nstartup_timeout_s = 7\n",
    )
    llm, fixed = config.backends["llm"], config.backends["fixed"]
    assert llm.startup_timeout(None) == DEFAULT_STARTUP_TIMEOUT_S
    assert llm.startup_timeout(5.0) == 60.0
    assert llm.startup_timeout(100.0) == 300.0
    assert fixed.startup_timeout(100.0) == 7.0


def test_the_shipped_example_is_valid_and_uses_every_key(tmp_path: Path) -> None:
    example = REPO / "config" / "example.toml"
    config = load_config(example, env={})
    assert len(config.backends) == 2
    text = example.read_text()
    from yard import config as config_module

    every_key = (
        config_module.SERVER_KEYS
        + config_module.SCHEDULER_KEYS
        + config_module.DEVICE_KEYS
        + config_module.APP_KEYS
        + config_module.BACKEND_KEYS
        + config_module.WARMUP_KEYS
        + config_module.JOBS_KEYS
    )
    missing = [key for key in every_key if f"{key} =" not in text and f".{key}]" not in text]
    assert missing == []


def test_yard_check_prints_a_summary_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runnable = MINIMAL_BACKEND.replace('"server"', '"{python}"')
    path = write(tmp_path, runnable + "[apps.a]\nkey = 'k'\n")
    assert cli.main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{path}: OK" in out
    assert "backends: 1 (llm)" in out
    assert "models:   1 (m1)" in out
    assert "apps:     1 (a)" in out
    assert "devices:  host" in out


def test_yard_check_prints_every_error_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "[server]\nlisen = 1\n[backends.b]\nmodels = ['m']\n")
    assert cli.main(["check", str(path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"{path}: server.lisen: unknown key; did you mean 'listen'? (known here: "
        f"{', '.join(SERVER_KEYS)})",
        f'{path}: backends.b.command: is missing: the argv to start it, e.g. ["llama-server", ...]',
        "2 errors",
    ]


def test_yard_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for name in ("serve", "check", "probe", "status", "jobs"):
        assert name in out


def test_a_subcommand_whose_module_is_missing_fails_only_when_used(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(cli.COMMANDS, "ghost", cli.Command("yard.no_such_module", "not here"))
    assert cli.main(["ghost"]) == 2
    assert "yard.no_such_module is missing" in capsys.readouterr().err
    path = write(tmp_path, "")
    assert cli.main(["check", str(path)]) == 0


def test_yard_check_fails_naming_the_key_of_a_program_that_cannot_be_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        """
        [backends.a]
        models = ["a"]
        command = ["no-such-program-here", "{port}"]
        model_file = "models/a.gguf"
        [backends.b]
        models = ["b"]
        command = ["./bin/server"]
        cwd = "work"
        [backends.c]
        models = ["c"]
        command = ["{python}", "-m", "http.server", "{port}"]
        """,
    )
    assert cli.main(["check", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"{path}: backends.a.model_file: warning: {tmp_path / 'models' / 'a.gguf'} does not "
        "exist (yet)",
        f"{path}: backends.b.cwd: warning: {tmp_path / 'work'} is not a directory (yet)",
        f"{path}: backends.a.command[0]: no-such-program-here is not on PATH",
        f"{path}: backends.b.command[0]: {tmp_path / 'work/bin/server'} is not an executable file",
        "2 errors",
    ]
    assert "OK" not in captured.out


def test_yard_check_names_what_to_do_when_no_llama_server_is_here(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(
        tmp_path,
        """
        [backends.llm]
        models = ["m"]
        command = ["{llama_server}", "--port", "{port}"]
        """,
    )
    monkeypatch.setenv("YARD_LLAMA_SERVER", str(tmp_path / "not-here"))
    assert cli.main(["check", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}: backends.llm.command[0]: YARD_LLAMA_SERVER={tmp_path / 'not-here'}" in err
    server = tmp_path / "llama-server"
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    monkeypatch.setenv("YARD_LLAMA_SERVER", str(server))
    assert cli.main(["check", str(path)]) == 0


def test_llama_server_placeholder_stands_alone_as_the_first_word(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [backends.llm]
        models = ["m"]
        command = ["nice", "{llama_server}"]
        env = { X = "{llama_server}" }
        """,
    )
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert refused.value.errors == [
        f"{path}: backends.llm.command[1]: {{llama_server}} stands alone as the first word of "
        'command, e.g. command = ["{llama_server}", "--port", "{port}", ...]',
        f"{path}: backends.llm.env.X: {{llama_server}} is for the first word of command only",
    ]
