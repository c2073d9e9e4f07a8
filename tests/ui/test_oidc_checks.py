"""The page's OpenID Connect client, without a provider: the ID-token checks a conforming provider
never fails on purpose (wrong audience, expired, wrong issuer, nonce, `azp`), on tokens signed with
the test keys and checked by the gateway's own JwtVerifier; and the `ui.oidc` settings."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.config import OidcSettings, load_settings
from gateway.core.errors import ConfigError
from gateway.crypto.jwt import Jwks
from gateway.transports.ui.oidc import OidcLogin, OidcRefused, id_token_verifier, s256
from tests.test_http_auth import DEFAULT_JWKS, ISSUER, claims, token


# ---- the ID token's own checks, on tokens signed with the test keys ------------------------------


@pytest.fixture
def oidc_settings(tmp_path: Path) -> tuple[OidcSettings, Jwks]:
    (tmp_path / "jwks.json").write_text(json.dumps(DEFAULT_JWKS))
    settings = OidcSettings(issuer=ISSUER, client_id="dharma-ui", redirect_url="https://gw.example/ui/oidc/callback")
    return settings, Jwks(tmp_path / "jwks.json")


@pytest.mark.parametrize(("body", "reason"), [
    ({"aud": "another-client"}, "token's audience is not this gateway"),
    ({"exp": int(time.time()) - 600}, "token has expired"),
    ({"iss": "https://evil.example"}, "issued by an issuer this gateway does not trust"),
    ({"nonce": "another-login"}, "nonce does not match this login"),
    ({"nonce": None}, "nonce does not match this login"),
    ({"aud": ["dharma-ui", "other"], "azp": "other"}, "issued to another client (`azp`)"),
])
async def test_an_id_token_that_fails_a_check_is_refused(oidc_settings: tuple[OidcSettings, Jwks], body: dict[str, Any],
                                                         reason: str) -> None:
    settings, jwks = oidc_settings
    verifier = id_token_verifier(settings, jwks, ["RS256"])
    login = OidcLogin(settings)
    good = claims(aud="dharma-ui", sub="admin", nonce="n-123")
    assert (await login.verify_id_token(verifier, token(good), "n-123")).subject == "admin"
    with pytest.raises(OidcRefused) as refused:
        await login.verify_id_token(verifier, token(claims(**{**good, **body})), "n-123")
    assert refused.value.status == 401 and reason in refused.value.message


# ---- configuration -----------------------------------------------------------------------------------


def test_the_client_secret_comes_from_the_environment_or_a_file_never_from_dharma_yaml(tmp_path: Path) -> None:
    oidc = {"issuer": "https://idp.example", "client_id": "c", "redirect_url": "https://gw.example/ui/oidc/callback"}
    (tmp_path / "dharma.yaml").write_text(json.dumps({"ui": {"oidc": {**oidc, "client_secret": "plain"}}}))
    with pytest.raises(ConfigError, match=r"dharma.yaml:1: ui.oidc.client_secret must not be written in a file"):
        load_settings(tmp_path / "dharma.yaml", {})
    (tmp_path / "dharma.yaml").write_text(json.dumps({"ui": {"oidc": oidc}}))
    from_env = load_settings(tmp_path / "dharma.yaml", {"DHARMA_UI__OIDC__CLIENT_SECRET": "from-env"}).ui.oidc
    assert from_env is not None and OidcLogin(from_env).secret == "from-env" and "from-env" not in repr(from_env)
    (tmp_path / "secret").write_text("from-file\n")
    (tmp_path / "dharma.yaml").write_text(json.dumps({"ui": {"oidc": {**oidc, "client_secret_file": "secret"}}}))
    from_file = load_settings(tmp_path / "dharma.yaml", {}).ui.oidc
    assert from_file is not None and OidcLogin(from_file).secret == "from-file"


@pytest.mark.parametrize(("change", "reason"), [
    ({"redirect_url": "https://gw.example/elsewhere"}, "its path must be /ui/oidc/callback"),
    ({"issuer": "http://idp.example"}, "plain http is allowed only on a loopback host"),
    ({"scopes": ["profile"]}, "scopes must include openid"),
])
def test_a_bad_oidc_setting_is_named(tmp_path: Path, change: dict[str, Any], reason: str) -> None:
    oidc = {"issuer": "https://idp.example", "client_id": "c", "redirect_url": "https://gw.example/ui/oidc/callback", **change}
    (tmp_path / "dharma.yaml").write_text(json.dumps({"ui": {"oidc": oidc}}))
    with pytest.raises(ConfigError, match="ui.oidc") as error:
        load_settings(tmp_path / "dharma.yaml", {})
    assert reason in str(error.value)


def test_pkce_s256_matches_rfc_7636_appendix_b() -> None:
    assert s256("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk") == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
