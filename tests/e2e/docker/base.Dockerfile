# Test-only base image: a Debian bookworm root filesystem made by debootstrap (imported
# as kvserve-debootstrap:bookworm; Docker Hub is not reachable from CI) plus the CA
# bundle of the machine running the tests, so that pip inside the build trusts its egress
# proxy. The project's Dockerfile builds FROM this only in tests (--build-arg
# PYTHON_IMAGE=kvserve-test-base:bookworm); its default stays the public python image,
# and no CA of this machine ever goes into that.
FROM kvserve-debootstrap:bookworm
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
