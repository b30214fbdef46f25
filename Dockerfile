# redcell's image: one static binary (router, cell and the tools: redcell -h),
# run as a non-root user on a base with no shell.
#
#   docker build -t redcell:dev .
#   docker compose -f deploy/compose/compose.yaml up     (docs/operations.md)
#
# `redcell cells add|move|remove` drive MariaDB's own tools (mariadb-dump and
# the mariadb client): run them from a machine or image that has them, not
# from this one.

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# CGO off: a static binary that needs no libc from the base image.
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/redcell ./cmd/redcell

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/redcell /usr/local/bin/redcell
USER nonroot:nonroot
# The router's public port, a cell's port, the admin ports and gossip, as
# deploy/compose/redcell.yaml sets them; a config may choose others.
EXPOSE 8080 9101 9200 9201 7946 7946/udp
ENTRYPOINT ["/usr/local/bin/redcell"]
CMD ["--help"]
