#!/usr/bin/env bash
# From a workstation with Docker and AWS credentials: the same build and push as
# buildspec.yml. Builds each flavour with docker/build.sh, logs in to ECR, creates the
# repository if missing, pushes <flavor>-<commit> tags, checks the manifest media type,
# and prints the image URIs.
#
# usage: docker/build-and-push.sh [--flavor gpu|trn1|cpu|both] [--region REGION]
#                                 [--account ACCOUNT] [--repository NAME] [--tag-suffix S]
#                                 [--registry HOST[:PORT]] [--image LOCAL_IMAGE]
#   defaults: --flavor gpu, --region $AWS_REGION/$AWS_DEFAULT_REGION,
#             --account from `aws sts get-caller-identity`, --repository sagemaker-byoc-training,
#             --tag-suffix the first 12 characters of git HEAD (plus -dirty for local edits)
#   --registry: push to this registry instead of ECR (no aws calls; e.g. a registry on
#             127.0.0.1 for a test); the manifest is checked over the registry's HTTP API
#   --image:  push this already built (and smoke-tested) local image instead of building;
#             one flavour only
# Prints each pushed image as REGISTRY/REPOSITORY:TAG@sha256:DIGEST.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=docker/ecr.sh
. "$repo_root/docker/ecr.sh"

flavor=gpu region=${AWS_REGION:-${AWS_DEFAULT_REGION:-}} account='' repository=sagemaker-byoc-training suffix=''
registry='' local_image=''
while (($#)); do
    case "$1" in
        --flavor) flavor=${2:?}; shift 2 ;;
        --region) region=${2:?}; shift 2 ;;
        --account) account=${2:?}; shift 2 ;;
        --repository) repository=${2:?}; shift 2 ;;
        --tag-suffix) suffix=${2:?}; shift 2 ;;
        --registry) registry=${2:?}; shift 2 ;;
        --image) local_image=${2:?}; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "build-and-push: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
mapfile -t flavors < <(ecr_flavors "$flavor")
if [ -n "$local_image" ] && ((${#flavors[@]} != 1)); then
    echo "build-and-push: --image pushes one image: name one --flavor" >&2; exit 2
fi
if [ -z "$registry" ]; then
    [ -n "$region" ] || { echo "build-and-push: no region (--region or AWS_REGION)" >&2; exit 2; }
    if [ -z "$account" ]; then
        account=$(aws sts get-caller-identity --query Account --output text)
    fi
fi
revision=$(git -C "$repo_root" rev-parse HEAD)
if [ -z "$suffix" ]; then
    suffix=${revision:0:12}
    git -C "$repo_root" diff --quiet HEAD -- || suffix="$suffix-dirty"
fi

ecr=0
if [ -z "$registry" ]; then
    ecr=1
    registry=$(ecr_registry "$account" "$region")
    ecr_login "$registry" "$region"
    ecr_ensure_repository "$repository" "$region"
fi

uris=()
for f in "${flavors[@]}"; do
    uri="$registry/$repository:$f-$suffix"
    if [ -n "$local_image" ]; then
        docker tag "$local_image" "$uri"
    else
        bash "$repo_root/docker/build.sh" --flavor "$f" --tag "$uri" --revision "$revision"
    fi
    docker push "$uri"
    if ((ecr)); then
        ecr_check_media_type "$repository" "$f-$suffix" "$region"
        digest=$(docker image inspect --format '{{join .RepoDigests "\n"}}' "$uri" | sed -n "s|^$registry/$repository@||p" | head -n1)
    else
        digest=$(python3 "$repo_root/docker/check-manifest.py" "$registry" "$repository" "$f-$suffix")
    fi
    uris+=("$uri${digest:+@$digest}")
done
printf '%s\n' "${uris[@]}"
