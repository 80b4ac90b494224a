"""Domains: one package per kind of task, each with its task model and sources, its agent
loop, harnesses, scripted teacher, Monte-Carlo continuation and demo adapter, bundled as a
``Domain``; and the registry that finds them by name.

- ``swe``: software engineering (SWE-bench-style tasks, HumanEval, the generated families,
  mini-swe-agent);
- ``web``: goals on self-hosted sites, the browser agent;
- ``assistant``: requests over a seeded world of tools, the tool-calling assistant.
"""

from orchard.domains.domain import Domain, Episodes, HarnessOptions, Listing, answer_submission
from orchard.domains.registry import (
    DOMAINS,
    demo_domain,
    demo_names,
    domain,
    domain_of,
    harness_names,
    load_tasks,
    make_harness,
    resolve,
    run_demo,
    task_set_names,
)

__all__ = ["DOMAINS", "Domain", "Episodes", "HarnessOptions", "Listing", "answer_submission",
           "demo_domain", "demo_names", "domain", "domain_of", "harness_names", "load_tasks",
           "make_harness", "resolve", "run_demo", "task_set_names"]
