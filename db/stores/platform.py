"""The platform's store (role ``exports_platform``): the global delivery switch, and nothing else.

``starter.py pause --global`` / ``resume --global`` change it over a pool of this role; the API's role may
not (migration 0019), so "the global switch is the platform's" holds in the database, not only in the
service's 403.
"""

from __future__ import annotations

from db.stores.switching import SwitchChanges


class PlatformStore(SwitchChanges):
    """The platform operators' store (role ``exports_platform``): set the global switch with its history."""
