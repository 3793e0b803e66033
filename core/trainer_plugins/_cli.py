"""The ``trainer-plugins`` console command: ``list``, ``doctor``, ``explain`` and ``goodput``."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any, Optional

from trainer_plugins._catalog import Catalog, get_catalog
from trainer_plugins._controls import ControlError, Controls
from trainer_plugins._isolation import describe_changes
from trainer_plugins._records import Run


def plugin_listing(catalog: Catalog) -> dict[str, Any]:
    """Every discovered plugin with its state and the names it provides per role, plus conflicts.

    Builds only the catalogue: imports plugin hook modules, never a device runtime.
    """
    plugins = []
    for record in catalog.manager.records.values():
        provides: dict[str, list[dict[str, Any]]] = {}
        for claim in catalog.declared.get(record.name, []):
            winner = catalog.claims.get(claim.entry.role, {}).get(claim.name)
            provides.setdefault(claim.entry.role, []).append(
                {
                    "name": claim.name,
                    "trainer": claim.entry.trainer,
                    "fabric": claim.entry.fabric,
                    "deprecated": claim.deprecated,
                    "active": winner is claim,
                }
            )
        plugins.append(
            {
                "name": record.name,
                "distribution": record.distribution,
                "version": record.version,
                "state": record.state,
                "reason": record.reason,
                "api": record.api,
                "unavailable": record.unavailable,
                "environ_changes": {key: list(change) for key, change in record.environ_changes.items()},
                "provides": provides,
            }
        )
    return {"plugins": plugins, "conflicts": [conflict.describe() for conflict in catalog.conflicts]}


#: What each plugin state and name mark printed by ``list`` means (printed as its legend).
STATE_LEGEND = {
    "loaded": "its hooks are in use",
    "quarantined": "set aside after an error (the reason follows); its names are unusable",
    "blocked": "switched off by TRAINER_PLUGINS_BLOCK / TRAINER_PLUGINS_ALLOW (docs/controls.md)",
}
MARK_LEGEND = {
    "deprecated": "an old name: selecting it warns and names the new one",
    "not active": "another plugin holds this name (see conflicts)",
}


def _print_listing(listing: dict[str, Any]) -> None:
    for plugin in listing["plugins"]:
        origin = f"{plugin['distribution']} {plugin['version']}" if plugin["distribution"] else "registered from code"
        reason = f" ({plugin['reason']})" if plugin["reason"] else ""
        print(f"{plugin['name']}  [{origin}]  {plugin['state']}{reason}")
        if plugin["unavailable"]:
            print(f"    not available in the last run that asked: {plugin['unavailable']}")
        for role, names in plugin["provides"].items():
            shown = []
            for item in names:
                marks = [
                    mark for mark, on in (("deprecated", item["deprecated"]), ("not active", not item["active"])) if on
                ]
                shown.append(item["name"] + (f" ({', '.join(marks)})" if marks else ""))
            print(f"    {role}: {', '.join(shown)}")
    if listing["conflicts"]:
        print("conflicts:")
        for line in listing["conflicts"]:
            print(f"    {line}")
    print("states:")
    for word, meaning in STATE_LEGEND.items():
        print(f"    {word}: {meaning}")
    print("marks:")
    for word, meaning in MARK_LEGEND.items():
        print(f"    ({word}): {meaning}")


def _availability(catalog: Catalog) -> dict[str, str]:
    """Each plugin accelerator ``"auto"`` may pick -> ``"available"``, ``"not available"`` or why its probe failed."""
    from trainer_plugins._availability import accelerator_available

    run, timeout = Run(), catalog.manager.controls.probe_timeout
    found = {}
    for _, name, claim in catalog.auto_candidates("trainer"):
        if claim.builtin:  # Lightning's own (probing its XLA accelerator would import torch_xla)
            continue
        available = accelerator_available(catalog.manager, run, name, claim, "trainer", "lightning", timeout)
        problem = run.unavailable.get(claim.plugin.name)
        found[name] = "available" if available else f"not available: {problem}" if problem else "not available"
    return found


def _doctor(catalog: Catalog) -> dict[str, Any]:
    manager = catalog.manager
    report = {record.label: info for record, info in manager.call_each("trainer_plugins_doctor", run=Run())}
    broken = {record.label: record.reason for record in manager.quarantined()}
    notes = {}
    for record in manager.records.values():
        note = {}
        if record.output:
            note["printed at import"] = record.output.rstrip("\n")
        if record.environ_changes:
            note["changed os.environ at import"] = describe_changes(record.environ_changes)
        if note:
            notes[record.label] = note
    conflicts = {
        f"{conflict.role} {conflict.name!r}": conflict.settle()
        or (f"{conflict.winner.plugin.label} serves it" if conflict.winner else conflict.describe())
        for conflict in catalog.conflicts
        if conflict.role == "accelerator" or conflict.winner is None
    }
    return {
        "backends": report,
        "availability": _availability(catalog),
        "conflicts": conflicts,
        "quarantined": broken,
        "side effects": notes,
    }


def _explain(args: argparse.Namespace) -> Any:
    from trainer_plugins._lightning import explain

    flags = {
        "accelerator": args.accelerator,
        "devices": args.devices,
        "strategy": args.strategy,
        "num_nodes": args.num_nodes,
        "precision": args.precision,
    }
    return explain(args.api, **flags)


def _parser() -> argparse.ArgumentParser:
    # `--json` is accepted before and after the subcommand: the subcommands' copy defaults to
    # SUPPRESS so that it does not overwrite a `--json` given before the subcommand.
    json_help = "print JSON instead of text (accepted before or after the subcommand)"
    parser = argparse.ArgumentParser(prog="trainer-plugins", description="Inspect trainer-plugins plugins.")
    parser.add_argument("--json", action="store_true", help=json_help)
    after = argparse.ArgumentParser(add_help=False)
    after.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=json_help)
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="{list,doctor,explain,goodput}", help="what to show (each takes --help)"
    )

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, parents=[after], help=text, description=text)

    command("list", "every discovered plugin, its state and the names it provides; imports no backend runtime")
    command("doctor", "the environment of each backend: versions, devices (may start device runtimes)")
    explain = command("explain", "which plugin supplies each role for the given flags, and why")
    explain.add_argument(
        "--api",
        choices=("trainer", "fabric"),
        default="trainer",
        help="resolve as lightning.Trainer or lightning.Fabric would (default: %(default)s)",
    )
    explain.add_argument(
        "--accelerator",
        default="auto",
        help="as Trainer(accelerator=...): 'auto', 'cpu', 'tpu', a plugin's name, ... (default: %(default)s)",
    )
    explain.add_argument(
        "--devices",
        default="auto",
        help="as Trainer(devices=...): 'auto', a count or a list such as '0,' (default: %(default)s)",
    )
    explain.add_argument("--strategy", default="auto", help="as Trainer(strategy=...) (default: %(default)s)")
    explain.add_argument("--num-nodes", type=int, default=1, help="as Trainer(num_nodes=...) (default: %(default)s)")
    explain.add_argument(
        "--precision",
        default=None,
        help="as Trainer(precision=...), e.g. 'bf16-true' (default: the accelerator's default)",
    )
    goodput = command("goodput", "the goodput ledger of a run directory: where its wall time went, attempt by attempt")
    goodput.add_argument("directory", help="the run directory (the Trainer's default_root_dir) or its goodput folder")
    return parser


def _goodput(args: argparse.Namespace) -> int:
    """Print the ledger of ``args.directory`` (text or JSON); 1 with one line on stderr when there is none."""
    from trainer_plugins._goodput_ledger import LedgerFormatError, goodput_table_lines
    from trainer_plugins._goodput_record import NoLedgerError, read_ledger

    try:
        ledger = read_ledger(args.directory)
    except NoLedgerError as error:
        print(
            f"trainer-plugins: error: {error}; a fit with Trainer(default_root_dir=...) set to this directory, on a"
            " strategy that keeps the goodput ledger, writes it (with a logger or a checkpoint callback).",
            file=sys.stderr,
        )
        return 1
    except LedgerFormatError as error:
        print(f"trainer-plugins: error: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"directory": str(args.directory), **ledger.as_dict()}, indent=2))
        return 0
    print(f"{args.directory}: run {ledger.run}")
    for line in goodput_table_lines(ledger):
        print(line)
    print("attempts:")
    for attempt in ledger.attempts:
        lost = f", {attempt.lost_steps} redone later" if attempt.lost_steps else ""
        resumed = f", resumed from {attempt.resumed_from}" if attempt.resumed_from else ""
        ended = attempt.ended or "did not finish (no last account: killed?)"
        print(
            f"  {attempt.number}: steps {attempt.first_step}-{attempt.last_step}{lost}, {attempt.wall_s:.1f} s,"
            f" {ended}{resumed}"
        )
    return 0


def _took(started: float, as_json: bool) -> None:
    """Report the command's run time: on stdout after text, on stderr after JSON (keeps stdout pure JSON)."""
    print(f"took {time.perf_counter() - started:.2f} s", file=sys.stderr if as_json else sys.stdout)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``trainer-plugins`` command; returns the exit status.

    ``doctor`` and ``explain`` end by reporting how long they took (``took <seconds> s``; on stderr
    with ``--json``).

    Exit status: 0 on success, 1 when ``explain`` rejects the flags or ``goodput`` finds no ledger
    it can read (the error is printed to stderr), 2 on a usage error (argparse) or an unreadable
    control variable (one line on stderr naming the variable and the accepted values). What plugins
    print is captured, so ``--json`` output is always valid JSON. When the reader of stdout goes
    away (``trainer-plugins goodput --json | head``), the command stops without a traceback and
    returns 141 (128 + ``SIGPIPE``), the status a shell reports for a command ended by a closed pipe.
    """
    started = time.perf_counter()
    args = _parser().parse_args(argv)
    try:
        Controls.from_env()  # every control readable, or one line and exit status 2
        status = _run(args, started)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not in the interpreter's exit
        return status
    except ControlError as error:
        print(f"trainer-plugins: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        _drop_stdout()
        return 128 + signal.SIGPIPE


def _drop_stdout() -> None:
    """Point stdout's descriptor at ``os.devnull``: the interpreter's last flush of the closed pipe is then silent."""
    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # stdout replaced by an object without a descriptor
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, descriptor)
    os.close(devnull)


def _run(args: argparse.Namespace, started: float) -> int:
    if args.command == "goodput":
        return _goodput(args)
    if args.command == "explain":
        try:
            explanation = _explain(args)
        except ControlError:
            raise
        except Exception as error:  # the flags were rejected: report it like the Trainer would raise it
            print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
            return 1
        print(json.dumps(explanation.as_dicts(), indent=2) if args.json else explanation)
        _took(started, args.json)
        return 0
    catalog = get_catalog()
    if args.command == "list":
        listing = plugin_listing(catalog)
        if args.json:
            print(json.dumps(listing, indent=2))
        else:
            _print_listing(listing)
        return 0
    report = _doctor(catalog)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        for backend, info in report["backends"].items():
            print(backend)
            for key, value in info.items():
                print(f"    {key}: {value}")
        print('accelerator="auto" candidates')
        for name, state in report["availability"].items():
            print(f"    {name}: {state}")
        if report["conflicts"]:
            print("names claimed by several plugins")
            for name, outcome in report["conflicts"].items():
                print(f"    {name}: {outcome}")
        for label, reason in report["quarantined"].items():
            print(f"{label}\n    quarantined: {reason}")
        for label, note in report["side effects"].items():
            print(label)
            for key, value in note.items():
                print(f"    {key}: {value}")
    _took(started, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
