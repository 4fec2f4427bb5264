"""redact_urls: no user, password or secret query value of any URL in a text survives, whatever it holds."""

from __future__ import annotations

import string

from hypothesis import given, settings
from hypothesis import strategies as st

from openenv_gym.redact import redact_urls

# What a user may paste into a URL's password without encoding it: anything but a slash (which
# would end the host), whitespace and quotes (which end a URL in running text).
PASTED = st.text(alphabet=st.sampled_from(sorted(set(string.printable) - set(string.whitespace) - set("/\"'<>`"))),
                 min_size=0, max_size=30)


@settings(max_examples=500)
@given(user=PASTED, password=PASTED, before=st.sampled_from(["", "fatal: unable to access '", "of ", "("]),
       scheme=st.sampled_from(["https", "http", "git+https", "ssh"]))
def test_no_part_of_a_password_survives(user, password, before, scheme):
    secret = "Zq" + password
    text = f"{before}{scheme}://{user}:{secret}@host.example:8443/org/repo.git@v1 failed"
    shown = redact_urls(text)
    assert "Zq" not in shown
    assert f"{scheme}://host.example:8443/org/repo.git@v1 failed" in shown


@settings(max_examples=300)
@given(value=st.text(alphabet=st.sampled_from(sorted(set(string.printable) - set(string.whitespace) - set("&#;\"'<>`"))),
                     max_size=30),
       key=st.sampled_from(["access_token", "private_token", "token", "api_key", "X-Amz-Signature", "sig", "password"]))
def test_secret_query_values_are_hidden_and_others_kept(value, key):
    shown = redact_urls(f"https://host.example/x?page=2&{key}=Zq{value}&ref=main#top")
    assert "Zq" not in shown and shown.startswith("https://host.example/x?page=2&") and shown.endswith("&ref=main#top")
