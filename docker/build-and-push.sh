#!/usr/bin/env bash
# From a workstation with Docker and AWS credentials: the same build and push as
# buildspec.yml. Builds each flavour with docker/build.sh, logs in to ECR, creates the
# repository if missing, pushes <flavor>-<commit> tags, checks the manifest media type,
# and prints the image URIs.
#
# usage: docker/build-and-push.sh [--flavor gpu|trn1|cpu|both] [--region REGION]
#                                 [--account ACCOUNT] [--repository NAME] [--tag-suffix S]
#   defaults: --flavor gpu, --region $AWS_REGION/$AWS_DEFAULT_REGION,
#             --account from `aws sts get-caller-identity`, --repository sagemaker-byoc-training,
#             --tag-suffix the first 12 characters of git HEAD (plus -dirty for local edits)
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=docker/ecr.sh
. "$repo_root/docker/ecr.sh"

flavor=gpu region=${AWS_REGION:-${AWS_DEFAULT_REGION:-}} account='' repository=sagemaker-byoc-training suffix=''
while (($#)); do
    case "$1" in
        --flavor) flavor=${2:?}; shift 2 ;;
        --region) region=${2:?}; shift 2 ;;
        --account) account=${2:?}; shift 2 ;;
        --repository) repository=${2:?}; shift 2 ;;
        --tag-suffix) suffix=${2:?}; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "build-and-push: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ -n "$region" ] || { echo "build-and-push: no region (--region or AWS_REGION)" >&2; exit 2; }
mapfile -t flavors < <(ecr_flavors "$flavor")
if [ -z "$account" ]; then
    account=$(aws sts get-caller-identity --query Account --output text)
fi
revision=$(git -C "$repo_root" rev-parse HEAD)
if [ -z "$suffix" ]; then
    suffix=${revision:0:12}
    git -C "$repo_root" diff --quiet HEAD -- || suffix="$suffix-dirty"
fi

registry=$(ecr_registry "$account" "$region")
ecr_login "$registry" "$region"
ecr_ensure_repository "$repository" "$region"

uris=()
for f in "${flavors[@]}"; do
    uri="$registry/$repository:$f-$suffix"
    bash "$repo_root/docker/build.sh" --flavor "$f" --tag "$uri" --revision "$revision"
    docker push "$uri"
    ecr_check_media_type "$repository" "$f-$suffix" "$region"
    uris+=("$uri")
done
printf '%s\n' "${uris[@]}"
