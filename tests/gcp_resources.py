"""The Compute Engine fake's firewalls, zones, default network, reserved addresses and serial consoles: the handlers
``GcpCloud`` dispatches to by name (``_firewalls_insert`` answers ``firewalls.insert``). A mixin of ``GcpCloud``, whose
state and helpers it uses."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import gcp_shapes as gs
from gcp_routes import Req
from gcp_shapes import BASE, ApiError, not_found


class NetworkResources:
    """Everything but instances and operations."""

    project: str
    zones: dict[str, list[str]]
    _region: dict[str, str]
    _nat: Iterator[str]
    _firewalls: dict[str, dict[str, Any]]
    _addresses: dict[tuple[str, str], dict[str, Any]]
    _consoles: dict[tuple[str, str], str]
    _new_op: Callable[..., dict[str, Any]]
    _list: Callable[..., dict[str, Any]]
    _get: Callable[[Req], dict[str, Any]]
    firewalls: Callable[[], list[dict[str, Any]]]

    def _firewall(self, name: str) -> dict[str, Any]:
        if name not in self._firewalls:
            raise not_found(f"projects/{self.project}/global/firewalls/{name}")
        return self._firewalls[name]

    def _firewalls_insert(self, r: Req) -> dict[str, Any]:
        fw = gs.new_firewall(r.body, self.project)
        if fw["name"] in self._firewalls:
            raise ApiError(
                409, f"The resource 'projects/{self.project}/global/firewalls/{fw['name']}' already exists", "alreadyExists"
            )
        return self._new_op(
            self.project, None, "insert", fw, fault=r.fault, on_done=lambda: self._firewalls.update({fw["name"]: fw})
        )

    def _firewalls_patch(self, r: Req) -> dict[str, Any]:
        fw = copy.deepcopy(self._firewall(r.name)) | copy.deepcopy(r.body) | {"name": r.name}
        gs.check_firewall(fw, self.project)
        return self._new_op(self.project, None, "patch", fw, fault=r.fault, on_done=lambda: self._firewalls.update({r.name: fw}))

    def _firewalls_delete(self, r: Req) -> dict[str, Any]:
        fw = self._firewall(r.name)
        return self._new_op(self.project, None, "delete", fw, fault=r.fault, on_done=lambda: self._firewalls.pop(r.name, None))

    def _firewalls_get(self, r: Req) -> dict[str, Any]:
        return copy.deepcopy(self._firewall(r.name))

    def _firewalls_list(self, r: Req) -> dict[str, Any]:
        return self._list("compute#firewallList", "global/firewalls", self.firewalls(), r.query)

    def _zones_list(self, r: Req) -> dict[str, Any]:
        zones = [gs.zone_json(self.project, z, self._region[z], i) for i, z in enumerate(sorted(self._region))]
        return self._list("compute#zoneList", "zones", zones, r.query)

    def _zones_get(self, r: Req) -> dict[str, Any]:
        return gs.zone_json(self.project, r.zone, self._region[r.zone], sorted(self._region).index(r.zone))  # type: ignore[arg-type,index]

    def _instances_getSerialPortOutput(self, r: Req) -> dict[str, Any]:
        """Serial port 1 as the VM printed it (``set_console``); GCE keeps it while the instance exists."""
        self._get(r)
        text = self._consoles.get((r.zone, r.name), "")  # type: ignore[arg-type]
        return {"kind": "compute#serialPortOutput", "contents": text, "start": "0", "next": str(len(text)),
                "selfLink": f"{BASE}/projects/{self.project}/zones/{r.zone}/instances/{r.name}/serialPort"}  # fmt: skip

    def _address(self, r: Req) -> dict[str, Any]:
        if (r.zone, r.name) not in self._addresses:
            raise not_found(f"projects/{self.project}/{r.zone}/addresses/{r.name}")
        return self._addresses[(r.zone, r.name)]  # type: ignore[index]

    def _addresses_insert(self, r: Req) -> dict[str, Any]:
        """A reserved external address, drawn from the natIP pool (an instance asking for it by natIP gets it)."""
        name = str(r.body.get("name", ""))
        if not gs.NAME_RE.fullmatch(name):
            raise gs.invalid("resource.name", name, f"Must be a match of regex '{gs.NAME_RE.pattern}'")
        if (r.zone, name) in self._addresses:
            raise ApiError(
                409, f"The resource 'projects/{self.project}/{r.zone}/addresses/{name}' already exists", "alreadyExists"
            )
        url = f"{BASE}/projects/{self.project}/{r.zone}/addresses/{name}"
        made = {"kind": "compute#address", "id": gs.new_id(), "name": name, "address": next(self._nat), "status": "RESERVED",
                "addressType": r.body.get("addressType", "EXTERNAL"), "region": f"{BASE}/projects/{self.project}/{r.zone}",
                "networkTier": "PREMIUM", "selfLink": url, "description": r.body.get("description", "")}  # fmt: skip
        return self._new_op(self.project, r.zone, "insert", made, fault=r.fault,
                            on_done=lambda: self._addresses.update({(r.zone, name): made}))  # type: ignore[dict-item]  # fmt: skip

    def _addresses_get(self, r: Req) -> dict[str, Any]:
        return copy.deepcopy(self._address(r))

    def _addresses_list(self, r: Req) -> dict[str, Any]:
        items = [copy.deepcopy(a) for (where, _), a in sorted(self._addresses.items()) if where == r.zone]
        return self._list("compute#addressList", f"{r.zone}/addresses", items, r.query)

    def _addresses_delete(self, r: Req) -> dict[str, Any]:
        made = self._address(r)
        return self._new_op(self.project, r.zone, "delete", made, fault=r.fault,
                            on_done=lambda: self._addresses.pop((r.zone, r.name), None))  # type: ignore[arg-type]  # fmt: skip

    def _networks_get(self, r: Req) -> dict[str, Any]:
        if r.name != "default":
            raise not_found(f"projects/{self.project}/global/networks/{r.name}")
        return gs.network_json(self.project, sorted(self.zones))
