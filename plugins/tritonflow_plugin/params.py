"""Trigger-form Params shared by every tritonflow DAG: titles, rules in words, clearable choices.

Airflow 3 renders a DAG's ``Param``s as the trigger form and validates the submitted conf with
JSON Schema (``jsonschema``) before it creates the run; a refused value comes back to the form
as ``Invalid input for param <name>: <jsonschema message>`` followed by the param's schema.
The helpers here keep that form usable by people:

* **Optional means nullable.** A field the user may leave empty is ``type: ["null", ...]`` with
  default ``None``. The form treats a field whose type does not allow null as required, and an
  empty text field as null, so a ``type: "string"`` param with default ``""`` makes the form open
  in an error state.
* **Rules in words.** A text rule (model name, version or alias...) is a :class:`TextRule`: its
  words are registered as a JSON-Schema ``format`` (:func:`register_rules`), so a refused value
  reads ``'3; drop' is not a 'version number (e.g. 3) or alias (e.g. champion)'`` instead of a
  regular expression. Some tasks check their value again (e.g. the publish pipeline's version
  selector).
* **Clearable optional choices.** JSON Schema's ``enum`` refuses null unless the enum holds it,
  and the Airflow 3.1 form does not render an enum holding ``None``; clearing a dropdown sends
  null. An optional choice is therefore a nullable text field offering its choices
  (``examples``, shown as suggestions) and checked by a rule in words
  (:func:`optional_choice`); a required choice keeps the dropdown and a real default
  (:func:`choice`).
* **Readable titles.** Every param has a ``title`` (the form's label) and a one-sentence
  ``description`` for users.

Importing this module registers the rules (cheap: ``re`` and ``jsonschema``, which Airflow
already imports); the package ``__init__`` imports it, so every process that loads the plugin
(API server, scheduler, DAG processor, workers) validates the same way. A process without the
registration would ignore the unknown format (JSON Schema's rule for formats), which is why
every rule a DAG uses must be listed in :data:`RULES` (:func:`text` refuses any other).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from airflow.sdk import Param


@dataclass(frozen=True)
class TextRule:
    """A rule a text param must follow, in words (the error message) and as a regex (the check).

    Attributes:
        words: What is expected, as a noun phrase (``"model name (letters, digits, ...)"``); it is
            the JSON-Schema format name, so it appears in the refusal as ``'x' is not a '<words>'``.
        pattern: The regex a non-empty value must match (``re.fullmatch``).
    """

    words: str
    pattern: str

    def accepts(self, value: Any) -> bool:
        """True for a non-string (type checks refuse those) or a string matching the rule."""
        return not isinstance(value, str) or re.fullmatch(self.pattern, value) is not None


def choice_rule(choices: Sequence[str]) -> TextRule:
    """The rule of an optional choice: exactly one of ``choices`` (words: ``one of a, b, c``)."""
    return TextRule("one of " + ", ".join(choices), "|".join(re.escape(c) for c in choices))


MODEL_NAME = TextRule("model name (letters, digits, '_', '.', '-'; starting with a letter or digit)",
                      r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
VERSION_OR_ALIAS = TextRule("version number (e.g. 3) or alias (e.g. champion; letters, digits, '_', '-')",
                            r"[1-9][0-9]*|[A-Za-z_][A-Za-z0-9_\-]*")
VERSION_NUMBER = TextRule("version number (digits, e.g. 3)", r"[1-9][0-9]*")
ALIAS_NAME = TextRule("alias name (letters, digits, '_', '-')", r"[A-Za-z0-9_\-]+")

#: Legacy MLflow stages a version can move to.
LEGACY_STAGES = choice_rule(["Staging", "Production", "Archived", "None"])
#: What a drift window is compared with (``drift_checks`` reference strategies).
REFERENCE_STRATEGIES = choice_rule(["training", "trailing", "seasonal", "training_seasonal"])

#: Every rule, registered as a JSON-Schema format when this module is imported. The API server
#: validates a trigger request without importing DAG files, so a rule a DAG uses must be listed
#: here (a rule only built inside a DAG file would be unknown to it, hence not checked there).
RULES: dict[str, TextRule] = {r.words: r for r in (MODEL_NAME, VERSION_OR_ALIAS, VERSION_NUMBER, ALIAS_NAME,
                                                   LEGACY_STAGES, REFERENCE_STRATEGIES)}


def register_rules(rules: Sequence[TextRule] | None = None) -> None:
    """Register rules as JSON-Schema formats of ``jsonschema.FormatChecker`` (idempotent).

    Airflow validates params with ``jsonschema.validate(value, schema,
    format_checker=FormatChecker())``; a ``FormatChecker()`` built after this call knows the
    rules. ``FormatChecker.checkers`` is the class-wide registry that ``FormatChecker.cls_checks``
    fills (deprecated only as a decorator).

    Args:
        rules: Rules to register (default: :data:`RULES`); they are added to :data:`RULES`.
    """
    from jsonschema import FormatChecker

    for rule in rules if rules is not None else list(RULES.values()):
        RULES[rule.words] = rule
        FormatChecker.checkers[rule.words] = (rule.accepts, ())


def text(title: str, description: str, *, rule: TextRule | None = None, default: str | None = None,
         max_length: int | None = None, **schema: Any) -> Param:
    """An optional text param (empty: null), checked by ``rule`` when given.

    Args:
        title: Form label.
        description: One sentence for users (what it is, what empty means).
        rule: The rule a non-empty value follows (refusals quote its words).
        default: Default value (``None``: empty).
        max_length: Longest accepted value, characters.
        **schema: Further JSON-Schema keywords.

    Raises:
        ValueError: ``rule`` is not listed in :data:`RULES` (the API server would not check it).
    """
    if rule is not None:
        if RULES.get(rule.words) != rule:
            raise ValueError(f"rule {rule.words!r} is not listed in tritonflow_plugin.params.RULES: the API "
                             "server would not know it")
        schema["format"] = rule.words
    if max_length is not None:
        schema["maxLength"] = max_length
    return Param(default, type=["null", "string"], title=title, description=description, **schema)


def choice(title: str, description: str, choices: Sequence[str], *, default: str,
           labels: Mapping[str, str] | None = None) -> Param:
    """A required choice: a dropdown with a real default (it is never empty).

    Raises:
        ValueError: ``default`` is not one of ``choices``.
    """
    if default not in choices:
        raise ValueError(f"default={default!r} is not one of choices {list(choices)}")
    extra: dict[str, Any] = {"values_display": dict(labels)} if labels else {}
    return Param(default, type="string", enum=list(choices), title=title, description=description, **extra)


def optional_choice(title: str, description: str, rule: TextRule) -> Param:
    """An optional choice the user can clear: nullable text offering the rule's choices as suggestions.

    The value is null (empty) or exactly one of the choices; a refusal lists them in words. No
    ``enum`` (see the module docstring).

    Args:
        title: Form label.
        description: One sentence for users.
        rule: A :func:`choice_rule` listed in :data:`RULES` (e.g. :data:`LEGACY_STAGES`).

    Raises:
        ValueError: ``rule`` is not a choice rule listed in :data:`RULES`.
    """
    if RULES.get(rule.words) != rule or not rule.words.startswith("one of "):
        raise ValueError(f"rule {rule.words!r} is not a choice rule listed in tritonflow_plugin.params.RULES: "
                         "the API server would not know it")
    return text(title, description, rule=rule, examples=rule.words.removeprefix("one of ").split(", "))


def loop_param() -> Param:
    """The ``loop`` param of the loop DAGs: the context another DAG hands on (validated at run start)."""
    return Param(None, type=["null", "object"], title="Loop context (set by other DAGs)",
                 description="Context handed on by the DAG that triggered this run; leave it empty.")


def refuse_unknown_conf_keys(context: Mapping[str, Any]) -> None:
    """Fail a run whose conf has a key that is not a param of its DAG (the closest valid key named).

    A typo such as ``verison`` would otherwise be ignored and the default used. The loop context
    and the registry-event keys are valid too (other DAGs and registry events send them).

    Raises:
        SettingsError: Names each unknown key, the closest valid key and the DAG.
    """
    from tritonflow.pipelines.loop_context import check_conf_keys
    from tritonflow_plugin.loop import dag_param_names

    dag_run = context.get("dag_run")
    conf = dict(getattr(dag_run, "conf", None) or {})
    dag_id = str(getattr(context.get("dag"), "dag_id", None) or getattr(dag_run, "dag_id", "?"))
    check_conf_keys(conf, dag_param_names(context), dag_id)


register_rules()

__all__ = ["ALIAS_NAME", "LEGACY_STAGES", "MODEL_NAME", "REFERENCE_STRATEGIES", "RULES", "TextRule", "VERSION_NUMBER",
           "VERSION_OR_ALIAS", "choice", "choice_rule", "loop_param", "optional_choice", "refuse_unknown_conf_keys",
           "register_rules", "text"]
