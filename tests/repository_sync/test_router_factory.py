"""The traffic router a deployment uses is chosen by TRITONFLOW_TRAFFIC_ROUTER."""

from __future__ import annotations

import pytest

from ground.exceptions import SettingsError
from ground.settings import Settings
from repository_sync.routing.nginx_router import NginxRouter
from repository_sync.routing.router import ROUTERS, make_router


def test_the_default_setting_builds_the_nginx_router_with_its_options(tmp_path):
    kind = Settings.from_env({}).traffic_router
    router = make_router(kind, conf_dir=tmp_path / "gateway", reload=["true"], fallback=True)
    assert isinstance(router, NginxRouter)
    assert router.conf_dir == tmp_path / "gateway" and router.fallback


def test_the_setting_is_read_from_the_environment_and_matched_without_case(tmp_path):
    kind = Settings.from_env({"TRITONFLOW_TRAFFIC_ROUTER": " NGINX "}).traffic_router
    assert isinstance(make_router(kind, conf_dir=tmp_path, reload=["true"]), NginxRouter)


@pytest.mark.parametrize("kind", ["kong", "", "nginx-plus"])
def test_an_unknown_router_is_refused_naming_the_setting_and_the_choices(kind, tmp_path):
    with pytest.raises(SettingsError) as err:
        make_router(kind, conf_dir=tmp_path, reload=["true"])
    assert "TRITONFLOW_TRAFFIC_ROUTER" in str(err.value) and repr(kind) in str(err.value)
    assert str(sorted(ROUTERS)) in str(err.value)
