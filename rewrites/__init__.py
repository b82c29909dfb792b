"""A gallery of custom rewrite rules, as a user writes them: each file is one small rule in the
public rule language (``from irkit import Rule, op, var, ...``), tested in
``tests/test_rewrites_gallery.py`` and shown verbatim in ``docs/rules.md`` ("Gallery").

This folder is examples, not part of the installed package: the built-in rule library is
:mod:`irkit.rules`. Use a rule with ``irkit.rewrite(model, rule)`` or add it to the defaults:
``irkit.optimize(model, rules=irkit.rules.default_rules() + RuleSet("mine", [rule]))``.
"""
