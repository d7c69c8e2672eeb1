"""A small client of a Confluent-compatible Schema Registry (Confluent, Karapace, Apicurio's ccompat API).

Only what an Avro source needs: the writer schema of an id (``GET /schemas/ids/{id}``), cached by id for
the process (an id's schema never changes), and the latest schema of a subject
(``GET /subjects/{subject}/versions/latest``, for ``create-table`` without columns). Plain ``urllib``: no
dependency for two GET requests.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

_TIMEOUT_S = 10.0


class SchemaRegistryError(RuntimeError):
    """The registry could not answer (unreachable, an error other than 'not found')."""


@dataclass
class SchemaRegistryClient:
    """GETs against ``url`` (e.g. ``http://127.0.0.1:8081``), schemas cached by id."""

    url: str
    _by_id: dict[int, str] = field(default_factory=dict)

    def _get(self, path: str) -> Any | None:
        address = self.url.rstrip("/") + path
        request = urllib.request.Request(address, headers={"Accept": "application/vnd.schemaregistry.v1+json, "
                                                                     "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise SchemaRegistryError(f"Schema Registry {address}: HTTP {error.code} {error.reason}") from None
        except (urllib.error.URLError, OSError, ValueError) as error:
            raise SchemaRegistryError(f"Schema Registry {address}: {error}") from None

    def schema(self, schema_id: int) -> str | None:
        """The schema JSON text of ``schema_id``; None when the registry does not know it."""
        text = self._by_id.get(schema_id)
        if text is None:
            found = self._get(f"/schemas/ids/{schema_id}")
            if found is None:
                return None
            if found.get("schemaType", "AVRO") != "AVRO":
                raise SchemaRegistryError(f"schema id {schema_id} is {found['schemaType']}, not Avro")
            text = str(found["schema"])
            self._by_id[schema_id] = text
        return text

    def latest(self, subject: str) -> tuple[int, str] | None:
        """The id and schema text of ``subject``'s latest version; None when the subject is unknown."""
        found = self._get(f"/subjects/{urllib.parse.quote(subject, safe='')}/versions/latest")
        if found is None:
            return None
        schema_id, text = int(found["id"]), str(found["schema"])
        self._by_id[schema_id] = text
        return schema_id, text
