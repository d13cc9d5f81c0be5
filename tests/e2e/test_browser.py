"""report.html in a real browser: headless Chromium (Debian's `chromium`, installed by .ci/run) opens it from
disk, the page requests nothing but itself and its data: images, and the screenshot is not blank. The check
is shown to catch a request on a page that makes one."""

from __future__ import annotations

import io

import pytest
from browser import render

pytestmark = [pytest.mark.chromium, pytest.mark.usefixtures("chromium")]


def outside_requests(requests, page):
    return [url for url in requests if url != page and not url.startswith("data:")]


def test_the_check_sees_a_request_a_page_makes(tmp_path):
    page = tmp_path / "page.html"
    # Port 9 (discard) on loopback: nothing answers, the request is still made and seen.
    page.write_text('<html><body><p>x</p><img src="http://127.0.0.1:9/pixel.png"></body></html>')
    _, requests = render(page.as_uri())
    assert outside_requests(requests, page.as_uri()) == ["http://127.0.0.1:9/pixel.png"]


@pytest.mark.e2e
def test_chromium_renders_the_report_offline(completed_run):
    from PIL import Image, ImageStat

    page = (completed_run / "results" / "report.html").as_uri()
    png, requests = render(page)
    assert requests[0] == page
    assert outside_requests(requests, page) == []
    assert sum(url.startswith("data:image/png") for url in requests) >= 3  # loss, router load, numerics
    image = Image.open(io.BytesIO(png)).convert("L")
    assert image.size == (1280, 2400)
    assert len(image.getcolors(maxcolors=1 << 16) or range(1 << 16)) > 20, "screenshot has almost no colours"
    assert ImageStat.Stat(image).stddev[0] > 10, "screenshot is blank"
