"""Settings: GLASSBOX_* variables parse into typed fields, overrides win, bad values name the field."""

from __future__ import annotations

import dataclasses

import pytest

from glassbox.service.cores import USER_OMP_THREADS_ENV
from glassbox.service.settings import (
    ENV_PREFIX,
    ListError,
    Settings,
    choices_for,
    field_names,
    load_settings,
    parse_int_list,
    sources,
    unknown_variables,
)


def test_defaults_without_environment() -> None:
    assert load_settings(environ={}) == Settings()


def test_environment_variables_parse_into_their_types() -> None:
    settings = load_settings(environ={
        "GLASSBOX_CUDA_GRAPHS": "off",
        "GLASSBOX_DEBUG_GRAPH_BUFFERS": "YES",
        "GLASSBOX_PORT": "9001",
        "GLASSBOX_HEADER_TIMEOUT_S": "2.5",
        "GLASSBOX_LENGTH_BUCKETS": "8,24,96",
        "GLASSBOX_QUANTIZE": "int8",
        "GLASSBOX_HOST": "0.0.0.0",
        "GLASSBOX_MAX_LENGTH": "",  # empty means unset, not zero
        "OTHER_PORT": "1",
    })
    assert settings.cuda_graphs is False
    assert settings.debug_graph_buffers is True
    assert settings.port == 9001
    assert settings.header_timeout_s == 2.5
    assert settings.length_buckets == (8, 24, 96)
    assert settings.quantize == "int8"
    assert settings.host == "0.0.0.0"
    assert settings.max_length == Settings().max_length


@pytest.mark.parametrize("raw, expected", [("1", True), ("true", True), ("On", True), ("0", False), ("no", False)])
def test_boolean_spellings(raw: str, expected: bool) -> None:
    assert load_settings(environ={"GLASSBOX_CPU_FALLBACK": raw}).cpu_fallback is expected


def test_overrides_beat_environment_and_none_means_not_given() -> None:
    env = {"GLASSBOX_PORT": "9001", "GLASSBOX_DEVICE": "cuda", "GLASSBOX_THREADS": "3"}
    settings = load_settings({"port": 9100, "device": "cpu", "threads": None, "max_length": "64"}, environ=env)
    assert settings.port == 9100
    assert settings.device == "cpu"
    assert settings.threads == 3
    assert settings.max_length == 64  # string overrides (CLI text) are parsed like the environment


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLASSBOX_MAX_BATCH_SIZE", "7")
    assert load_settings().max_batch_size == 7


@pytest.mark.parametrize("variable, raw, field", [
    ("GLASSBOX_PORT", "eighty", "port"),
    ("GLASSBOX_PORT", "80.5", "port"),
    ("GLASSBOX_BODY_TIMEOUT_S", "soon", "body_timeout_s"),
    ("GLASSBOX_BATCH_BUCKETS", "1,2,x", "batch_buckets"),
    ("GLASSBOX_CUDA_GRAPHS", "maybe", "cuda_graphs"),
    ("GLASSBOX_DEVICE", "tpu", "device"),
    ("GLASSBOX_QUANTIZE", "int4", "quantize"),
    ("GLASSBOX_OVERSIZE", "drop", "oversize"),
])
def test_invalid_environment_values_name_the_variable(variable: str, raw: str, field: str) -> None:
    with pytest.raises(ValueError, match=variable):
        load_settings(environ={variable: raw})


@pytest.mark.parametrize("overrides, field", [
    ({"max_length": 0}, "max_length"),
    ({"max_batch_size": -1}, "max_batch_size"),
    ({"threads": -2}, "threads"),
    ({"length_buckets": ()}, "length_buckets"),
    ({"batch_buckets": (4, 0)}, "batch_buckets"),
    ({"drain_timeout_s": 0.0}, "drain_timeout_s"),
    ({"fallback_cooldown_s": 0.0}, "fallback_cooldown_s"),
    ({"fallback_cooldown_s": 10.0}, "fallback_cooldown_max_s"),  # above the default ceiling of 5 s
    ({"port": 70000}, "port"),
    ({"quantize": "int4"}, "quantize"),
    ({"ready_when_degraded": 503}, "ready_when_degraded"),  # the literal is the string "503"
    ({"no_such_setting": 1}, "no_such_setting"),
    ({"no_such_setting": "1"}, "no_such_setting"),
    ({"keep_alive_timeout_s": 0}, "keep_alive_timeout_s"),
    # float() takes these: a NaN header timeout left every connection unanswered, an infinite drain crashed at exit
    ({"header_timeout_s": float("nan")}, "header_timeout_s must be a finite number"),
    ({"body_timeout_s": float("inf")}, "body_timeout_s must be a finite number"),
    ({"drain_timeout_s": float("inf")}, "drain_timeout_s must be a finite number"),
    ({"drain_timeout_s": "nan"}, "drain_timeout_s must be a finite number"),
    ({"exit_when_dead_s": float("inf")}, "exit_when_dead_s must be a finite number"),
    ({"fallback_cooldown_max_s": float("inf")}, "fallback_cooldown_max_s must be a finite number"),
    ({"latency_slo_ms": 0.0}, "latency_slo_ms must be positive"),
    ({"latency_slo_ms": float("nan")}, "latency_slo_ms must be a finite number"),
    # a limit of 0 or less refused every request, /readyz included, while the log said ready
    ({"max_header_bytes": -5}, "max_header_bytes must be positive"),
    ({"max_body_bytes": 0}, "max_body_bytes must be positive"),
    ({"shed_window_ms": -1}, "shed_window_ms must be 0"),
    # uvicorn would keep these as literals no peer matches, trusting nobody in silence
    ({"forwarded_allow_ips": "10.0.0.1/8"}, "forwarded_allow_ips: '10.0.0.1/8'"),  # host bits set
    ({"forwarded_allow_ips": "127.0.0.1, proxy.internal"}, "forwarded_allow_ips: 'proxy.internal'"),
    # a hub-style name (TEI's model ids are org/name) that no /v2/models/{name} route could ever match
    ({"model_name": "BAAI/bge-reranker-base"}, "model_name must not contain '/'"),
])
def test_invalid_overrides_raise_value_error_naming_the_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        load_settings(overrides, environ={})


@pytest.mark.parametrize("trusted", ["*", " * ", "10.0.0.0/8, *", "127.0.0.1,::1", "10.0.0.0/8, 192.0.2.7",
                                     "2001:db8::/32", ""])
def test_forwarded_allow_ips_takes_addresses_networks_or_a_star(trusted: str) -> None:
    assert load_settings({"forwarded_allow_ips": trusted}, environ={}).forwarded_allow_ips == trusted


def test_every_field_has_help_and_a_literal_has_choices() -> None:
    for f in dataclasses.fields(Settings):
        assert f.metadata.get("help"), f.name
    assert choices_for("device") == ("auto", "cuda", "cpu")
    assert choices_for("cuda_dtype") == ("fp16", "bf16", "fp32")
    assert choices_for("port") is None
    assert choices_for("model") is None


def test_every_field_can_be_set_from_the_environment() -> None:
    """Round trip: each field's default, written out as text, parses back to the default."""
    defaults = Settings()
    env = {}
    for name in field_names():
        value = getattr(defaults, name)
        text = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
        env[ENV_PREFIX + name.upper()] = text or "x"
    settings = load_settings(environ=env)
    for name in field_names():
        expected = getattr(defaults, name)
        if expected == "":
            assert getattr(settings, name) == "x"
        else:
            assert getattr(settings, name) == expected, name


def test_settings_are_frozen_and_replace_returns_a_copy() -> None:
    settings = Settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.port = 1  # type: ignore[misc]
    changed = settings.replace(port=1)
    assert changed.port == 1 and settings.port == 8000


@pytest.mark.parametrize("raw, reason", [
    ("16 32", "got '16 32' (separate values with commas, no spaces)"),
    ("16, 32", "' 32', which is not a positive whole number (separate values with commas, no spaces)"),
    ("16,,32", "an empty part"),
    ("16,32,", "an empty part"),
    ("", "got an empty value"),
    ("16,16,32", "16 appears twice"),
    ("32,16", "values must be in ascending order (16 comes after 32)"),
    ("0,16", "0 is not allowed"),
    ("-1,16", "'-1', which is not a positive whole number"),
    ("16,x", "'x', which is not a positive whole number"),
    ("16,\N{ARABIC-INDIC DIGIT ONE}", "which is not a positive whole number"),
])
def test_lists_are_parsed_strictly(raw: str, reason: str) -> None:
    with pytest.raises(ListError) as caught:
        parse_int_list(raw)
    assert reason in str(caught.value)
    # The same text from the environment is an error naming the variable (never one bucket of 1632, then capped).
    with pytest.raises(ValueError) as from_env:
        load_settings(environ={"GLASSBOX_LENGTH_BUCKETS": raw or ","})
    assert str(from_env.value).startswith("GLASSBOX_LENGTH_BUCKETS: ")


def test_a_well_formed_list_parses() -> None:
    assert parse_int_list("16,32,64") == (16, 32, 64)
    assert parse_int_list("7") == (7,)
    assert load_settings({"batch_buckets": "1,4,8"}, environ={}).batch_buckets == (1, 4, 8)


def test_unknown_variables_are_named_with_the_closest_known_one() -> None:
    env = {"GLASSBOX_MAX_BATCHSIZE": "8", "GLASSBOX_PROT": "1", "GLASSBOX_ZZZZZZZZZZZZ": "1",
           "GLASSBOX_PORT": "8001", "GLASSBOX_CHAOS_TOKEN": "t", "GLASSBOX_DEFAULT_MODEL_DIR": "/m", "PATH": "/bin"}
    assert unknown_variables(env) == [
        "GLASSBOX_MAX_BATCHSIZE is not a glassbox setting and is ignored; did you mean GLASSBOX_MAX_BATCH_SIZE?",
        "GLASSBOX_PROT is not a glassbox setting and is ignored; did you mean GLASSBOX_PORT?",
        "GLASSBOX_ZZZZZZZZZZZZ is not a glassbox setting and is ignored; `glassbox serve --help` lists the "
        "variables",
    ]
    assert unknown_variables({"GLASSBOX_" + name.upper(): "1" for name in field_names()}) == []


def test_the_token_variables_read_outside_the_settings_are_not_called_unknown() -> None:
    from glassbox.chaos.client import TOKEN_ENV as CHAOS_TOKEN
    from glassbox.chaos.grafana import TOKEN_ENV as GRAFANA_TOKEN
    from glassbox.service.http.profile import TOKEN_ENV as PROFILE_TOKEN

    assert unknown_variables({CHAOS_TOKEN: "x", GRAFANA_TOKEN: "x", PROFILE_TOKEN: "x"}) == []


def test_the_variable_serve_sets_for_itself_is_not_called_unknown() -> None:
    # serial_main_thread keeps the user's OMP_NUM_THREADS there before the unknown-variable warnings are logged
    assert unknown_variables({USER_OMP_THREADS_ENV: "", "OMP_NUM_THREADS": "1"}) == []


def test_a_nan_from_the_environment_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValueError, match="header_timeout_s must be a finite number"):
        load_settings(environ={"GLASSBOX_HEADER_TIMEOUT_S": "nan"})


def test_sources_name_the_variable_that_sets_a_value_and_hide_secrets() -> None:
    shown = sources({"GLASSBOX_PORT": "9001", "GLASSBOX_API_KEY": "s3cret", "GLASSBOX_MAX_LENGTH": ""})
    assert shown["port"] == ("9001", "GLASSBOX_PORT")
    assert shown["api_key"] == ("(hidden)", "GLASSBOX_API_KEY")
    assert shown["max_length"] == ("256", "default")  # empty means unset
    assert shown["length_buckets"] == ("16,32,64,128,256", "default")


def test_every_setting_is_in_one_group_with_a_short_help_and_details_name_settings() -> None:
    from glassbox.service.settings_help import DETAILS, GROUPS

    grouped = [name for _title, _about, names in GROUPS for name in names]
    assert sorted(grouped) == sorted(field_names())  # each once
    long = {f.name: len(f.metadata["help"]) for f in dataclasses.fields(Settings) if len(f.metadata["help"]) > 130}
    assert long == {}, "a flag's help is one or two lines; the rest goes into DETAILS (docs/settings.md)"
    assert set(DETAILS) <= set(field_names())


def test_serve_help_shows_the_groups_and_no_secret_is_a_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from glassbox.service.cli import main
    from glassbox.service.settings_help import GROUPS

    with pytest.raises(SystemExit) as done:
        main(["serve", "--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    words = " ".join(shown.split())  # argparse wraps the groups' lines to the terminal
    assert all(f"\n{title}:\n" in shown and f"{title}: {about}" in words for title, about, _names in GROUPS)
    assert "--api-key " not in shown and "--api-key-file" in shown
    with pytest.raises(SystemExit) as refused:
        main(["serve", "--api-key", "s3cret-on-the-command-line"])
    assert refused.value.code == 2
    said = capsys.readouterr().err
    assert "ps shows it" in said and "GLASSBOX_API_KEY" in said and "s3cret" not in said

