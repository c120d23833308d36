"""A minimal in-memory OSB broker written with openbrokerapi: the baseline of `bench/run`.

It offers the catalog brokkr serves (the JSON file named by BENCH_CATALOG, fetched from brokkr's
GET /v2/catalog, so service and plan ids are the same) and runs every operation of every plan
asynchronously, the way the quickstart's `async` plan does: provision, deprovision, bind and unbind
answer 202 with an operation, and last_operation reports it `succeeded` once BENCH_DELAY_MS
(brokkr's `delay` step) has passed. Bindings return the provision parameters' `credentials`
overlaid by the bind parameters', like the quickstart's blueprint. State lives in this process's
memory, under one lock, which is why it must be served by a single process (see bench/run).

Served as the package's README recommends for production: its Flask blueprint behind gunicorn,
e.g. `gunicorn -k gthread -w 1 --threads 16 -b 127.0.0.1:8082 openbrokerapi_broker:app`.
Credentials come from BROKKR_BROKER_USERNAME / BROKKR_BROKER_PASSWORD.
"""

import json
import logging
import os
import threading
import time
import uuid

from flask import Flask
from openbrokerapi import api, errors
from openbrokerapi.catalog import ServicePlan
from openbrokerapi.service_broker import (
    Binding,
    BindState,
    DeprovisionServiceSpec,
    GetBindingSpec,
    GetInstanceDetailsSpec,
    LastOperation,
    OperationState,
    ProvisionedServiceSpec,
    ProvisionState,
    Service,
    ServiceBroker,
    UnbindSpec,
)

DELAY = float(os.environ.get("BENCH_DELAY_MS", "10")) / 1000.0


def load_catalog(path):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    services = []
    for svc in doc["services"]:
        svc = dict(svc)
        plans = [ServicePlan(**plan) for plan in svc.pop("plans")]
        services.append(Service(plans=plans, **svc))
    return services


class Operation:
    """An operation that ends `DELAY` seconds after it starts, then applies `on_done` once."""

    def __init__(self, kind, on_done):
        self.id = str(uuid.uuid4())
        self.kind = kind
        self.started = time.monotonic()
        self.on_done = on_done
        self.done = False

    def state(self):
        if not self.done and time.monotonic() - self.started >= DELAY:
            self.done = True
            self.on_done()
        if self.done:
            return LastOperation(OperationState.SUCCEEDED, f"{self.kind} succeeded")
        return LastOperation(OperationState.IN_PROGRESS, f"{self.kind} in progress")


class InMemoryBroker(ServiceBroker):
    def __init__(self, services):
        self.services = services
        self.lock = threading.Lock()
        self.instances = {}  # instance id -> {"details", "op", "bindings": {id: {...}}}

    def catalog(self):
        return self.services

    def provision(self, instance_id, details, async_allowed, **kwargs):
        if not async_allowed:
            raise errors.ErrAsyncRequired()
        with self.lock:
            if instance_id in self.instances:
                raise errors.ErrInstanceAlreadyExists()
            instance = {"details": details, "bindings": {}, "ready": False}
            op = Operation("provision", lambda: instance.update(ready=True))
            instance["op"] = op
            self.instances[instance_id] = instance
        return ProvisionedServiceSpec(state=ProvisionState.IS_ASYNC, operation=op.id)

    def get_instance(self, instance_id, **kwargs):
        with self.lock:
            instance = self.instances.get(instance_id)
            if instance is None or not instance["ready"]:
                raise errors.ErrInstanceDoesNotExist()
            d = instance["details"]
            return GetInstanceDetailsSpec(d.service_id, d.plan_id, parameters=d.parameters)

    def deprovision(self, instance_id, details, async_allowed, **kwargs):
        if not async_allowed:
            raise errors.ErrAsyncRequired()
        with self.lock:
            instance = self.instances.get(instance_id)
            if instance is None:
                raise errors.ErrInstanceDoesNotExist()
            if not instance["op"].state().state == OperationState.SUCCEEDED:
                raise errors.ErrConcurrentInstanceAccess()
            op = Operation("deprovision", lambda: self.instances.pop(instance_id, None))
            instance["op"] = op
        return DeprovisionServiceSpec(is_async=True, operation=op.id)

    def last_operation(self, instance_id, operation_data, **kwargs):
        with self.lock:
            instance = self.instances.get(instance_id)
            if instance is None:
                raise errors.ErrInstanceDoesNotExist()
            return instance["op"].state()

    def bind(self, instance_id, binding_id, details, async_allowed, **kwargs):
        if not async_allowed:
            raise errors.ErrAsyncRequired()
        with self.lock:
            instance = self.instances.get(instance_id)
            if instance is None or not instance["ready"]:
                raise errors.ErrBadRequest()
            if binding_id in instance["bindings"]:
                raise errors.ErrBindingAlreadyExists()
            credentials = dict((instance["details"].parameters or {}).get("credentials", {}))
            credentials.update((details.parameters or {}).get("credentials", {}))
            binding = {"credentials": credentials, "ready": False}
            op = Operation("bind", lambda: binding.update(ready=True))
            binding["op"] = op
            instance["bindings"][binding_id] = binding
        return Binding(state=BindState.IS_ASYNC, operation=op.id)

    def get_binding(self, instance_id, binding_id, **kwargs):
        with self.lock:
            instance = self.instances.get(instance_id) or {"bindings": {}}
            binding = instance["bindings"].get(binding_id)
            if binding is None or not binding["ready"]:
                raise errors.ErrBindingDoesNotExist()
            return GetBindingSpec(credentials=binding["credentials"])

    def unbind(self, instance_id, binding_id, details, async_allowed, **kwargs):
        if not async_allowed:
            raise errors.ErrAsyncRequired()
        with self.lock:
            instance = self.instances.get(instance_id) or {"bindings": {}}
            binding = instance["bindings"].get(binding_id)
            if binding is None:
                raise errors.ErrBindingDoesNotExist()
            op = Operation("unbind", lambda: binding.update(gone=True))
            binding["op"] = op
        return UnbindSpec(is_async=True, operation=op.id)

    def last_binding_operation(self, instance_id, binding_id, operation_data, **kwargs):
        with self.lock:
            instance = self.instances.get(instance_id) or {"bindings": {}}
            binding = instance["bindings"].get(binding_id)
            if binding is None:
                # openbrokerapi has no 410 for bindings: an unknown binding's operation is over.
                return LastOperation(OperationState.SUCCEEDED, "gone")
            state = binding["op"].state()
            if binding.get("gone"):
                instance["bindings"].pop(binding_id, None)
            return state


def create_app():
    logger = logging.getLogger("openbrokerapi_broker")
    logger.setLevel(logging.WARNING)
    credentials = api.BrokerCredentials(
        os.environ["BROKKR_BROKER_USERNAME"], os.environ["BROKKR_BROKER_PASSWORD"]
    )
    broker = InMemoryBroker(load_catalog(os.environ["BENCH_CATALOG"]))
    flask_app = Flask(__name__)
    flask_app.register_blueprint(api.get_blueprint(broker, credentials, logger))
    return flask_app


app = create_app()
