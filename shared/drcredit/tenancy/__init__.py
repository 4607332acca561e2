"""Tenants of one deployment: their shares of the judge fleet and their budgets.

The pure rules live in :mod:`.policy` (the operator's ``DRCREDIT_TENANTS``), :mod:`.fair`
(who is served next, and each tenant's part of the fleet) and :mod:`.windows` (budget
windows and the check against them); :mod:`.owner` names whose a judge call is. The
judge fleet asks :mod:`.fair`; the API asks :mod:`.budgets` (the usage behind each
budget, read from the database).
"""
