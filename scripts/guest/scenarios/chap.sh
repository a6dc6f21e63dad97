# CHAP from the kernel: refused without credentials and with a wrong
# secret, admitted with the right one; mutual CHAP admitted when the
# target proves itself, refused by the host when it expects another secret.
try() { # NAME EXPECT(ok|refused) NODE-SETTINGS...
  name=$1 want=$2; shift 2
  step "$name"
  if out=$(login "$P0" "$@" 2>&1); then got=ok; else got=refused; fi
  if [ $got = ok ]; then
    d=$(wait_lun "$P0" 0 20) && dd if="$d" of=/dev/null bs=64k count=16 iflag=direct 2>/dev/null || got="ok-but-no-io"
    logout "$P0" >/dev/null
  fi
  forget "$P0" >/dev/null 2>&1
  why=$(echo "$out" | grep -o 'reported error.*' | head -1)
  info "$name: $got${why:+ ($why)}"
  # A refusal must be the authentication's, not a network or target error.
  case "$want:$got:$why" in
    ok:ok:*) pass ;;
    refused:refused:*authoriz*) pass ;;
    refused:refused:*"$REFUSAL_MUTUAL"*) [ "$name" = mutual-wrong-target-secret ] && pass || fail "refused: $why" ;;
    *) fail "wanted $want, got $got: $(echo "$out" | tr '\n' '|')" ;;
  esac
}
a=node.session.auth
# How open-iscsi reports a target that failed to prove itself.
REFUSAL_MUTUAL="non-retryable iSCSI login failure"
try no-credentials refused
try wrong-secret refused $a.authmethod CHAP $a.username "$CHAP_USER" $a.password "not-the-secret-99"
try wrong-user refused $a.authmethod CHAP $a.username someone-else $a.password "$CHAP_SECRET"
try chap ok $a.authmethod CHAP $a.username "$CHAP_USER" $a.password "$CHAP_SECRET"
try mutual-chap ok $a.authmethod CHAP $a.username "$CHAP_USER" $a.password "$CHAP_SECRET" \
  $a.username_in "$MUTUAL_USER" $a.password_in "$MUTUAL_SECRET"
try mutual-wrong-target-secret refused $a.authmethod CHAP $a.username "$CHAP_USER" \
  $a.password "$CHAP_SECRET" $a.username_in "$MUTUAL_USER" $a.password_in "an-impostor-secret"
step kernel-clean
check kernel_clean
