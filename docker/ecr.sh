# shellcheck shell=bash
# Functions for pushing images to Amazon ECR, shared by buildspec.yml (CodeBuild) and
# docker/build-and-push.sh (a workstation): source this file, then call them.
# Every value travels as an argument; nothing is run through a shell string.
# Needs: aws (CLI v2), docker.

# ecr_registry ACCOUNT REGION -> the registry host name
ecr_registry() {
    local account=$1 region=$2
    case "$region" in
        cn-*) printf '%s.dkr.ecr.%s.amazonaws.com.cn\n' "$account" "$region" ;;
        *) printf '%s.dkr.ecr.%s.amazonaws.com\n' "$account" "$region" ;;
    esac
}

# ecr_login REGISTRY REGION: docker login with a token from ECR (password on stdin).
ecr_login() {
    local registry=$1 region=$2
    aws ecr get-login-password --region "$region" \
        | docker login --username AWS --password-stdin "$registry"
}

# ecr_ensure_repository NAME REGION: creates the repository when missing (tag
# immutability off: the commit tags are unique, the build-cache tags move).
ecr_ensure_repository() {
    local name=$1 region=$2
    if ! aws ecr describe-repositories --region "$region" --repository-names "$name" >/dev/null 2>&1; then
        echo "ecr: creating repository $name in $region"
        aws ecr create-repository --region "$region" --repository-name "$name" \
            --image-scanning-configuration scanOnPush=true >/dev/null
    fi
}

# ecr_check_media_type NAME TAG REGION: fails unless ECR stored a Docker v2 manifest
# (SageMaker rejects OCI manifests and manifest lists).
ecr_check_media_type() {
    local name=$1 tag=$2 region=$3 media_type
    media_type=$(aws ecr describe-images --region "$region" --repository-name "$name" \
        --image-ids "imageTag=$tag" --query 'imageDetails[0].imageManifestMediaType' --output text)
    if [ "$media_type" != "application/vnd.docker.distribution.manifest.v2+json" ]; then
        echo "ecr: $name:$tag has manifest type $media_type; SageMaker needs a Docker v2 manifest" >&2
        return 1
    fi
}

# ecr_flavors FLAVOR -> the flavours to build, one a line (FLAVOR: gpu, trn1, cpu or both).
ecr_flavors() {
    case "$1" in
        both) printf '%s\n' gpu trn1 ;;
        gpu|trn1|cpu) printf '%s\n' "$1" ;;
        *) echo "ecr: FLAVOR must be gpu, trn1, cpu or both (got '$1')" >&2; return 2 ;;
    esac
}

# ecr_write_image_detail FILE FLAVOR=URI...: imageDetail.json for CodePipeline. ImageURI
# is the first image (what an ECS/SageMaker deploy action reads); ImageURIs maps every
# flavour built to its URI.
ecr_write_image_detail() {
    local out=$1
    shift
    python3 - "$out" "$@" <<'PY'
import json, sys
out, pairs = sys.argv[1], [a.split("=", 1) for a in sys.argv[2:]]
detail = {"ImageURI": pairs[0][1], "ImageURIs": dict(pairs)}
with open(out, "w") as f:
    json.dump(detail, f, indent=2)
    f.write("\n")
PY
}
