"""Pure core: input model, parameters, URL matching, credit math and advantages.

Nothing in this package performs I/O or imports a web, database or queue framework;
given a validated group, its stored ordinal judgments and parameters it returns
credits and advantages.
"""
