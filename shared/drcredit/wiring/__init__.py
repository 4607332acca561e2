"""The composition root: settings -> database, judge, dispatcher, pipeline and audit judges.

It sits above every package it wires (``scoring``, ``broker``, ``audit``, ``judges``,
``storage``), so none of them imports it: the API, the CLI and the Celery services build
their process through :mod:`.runtime`, and a ``drcredit worker`` process through
:mod:`.worker`.
"""
