#!/bin/sh
# Rewrites, in the TypeScript sources, the citations of the design and style documents that used to be kept
# outside the repository into citations of docs/decisions.md, which holds the same numbers:
#
#   the design's "section N", "sections N and M", "sections N to M"  ->  docs/decisions.md §N, §N and §M, §N to §M
#   the design's "decision N", "decisions N and M", "decisions N-M"  ->  decision N, decisions N and M, decisions N-M
#   the style guide's "principle N"                                  ->  docs/decisions.md, principle N
#
# (In the old form each of these follows the upper-case name of its document.) The words may be split by a
# comment's line break (`*` or `//`): the break is kept where it was. A bare "(section N)" later on a line that
# cites docs/decisions.md §M becomes "(§N)". Nothing else changes.
#
# Deterministic and idempotent: files are taken in sorted order, written only when they change, and a second run
# changes nothing. It prints what it rewrote, then every line that still names one of the old documents and every
# section, decision or principle it wrote that docs/decisions.md has no heading for; it exits 1 if there is any.
#
# Usage: sh scripts/cite-docs.sh [FILE...]
#   Without FILE: every .ts file under agent/ bridge/ lib/ protocol/ test/ bench/ scripts/ (not node_modules/).
set -eu
cd "$(dirname "$0")/.."
exec perl -e '
use strict;
use warnings;
use File::Find ();

my @files = @ARGV;
if (!@files) {
  for my $dir (qw(agent bridge lib protocol test bench scripts)) {
    next unless -d $dir;
    File::Find::find(
      {
        no_chdir => 1,
        wanted => sub {
          if (-d $_ && /(?:^|\/)(?:node_modules|dist)$/) { $File::Find::prune = 1; return; }
          push @files, $_ if -f $_ && /\.ts$/;
        },
      },
      $dir,
    );
  }
}
@files = sort @files;

# The headings of docs/decisions.md: "## N. ..." sections, "### Decision N: ...", "### Principle N: ...".
my (%section, %decision, %principle);
open(my $dh, "<", "docs/decisions.md") or die "cite-docs: cannot read docs/decisions.md: $!\n";
while (my $line = <$dh>) {
  $section{$1} = 1 if $line =~ /^## (\d+)\. /;
  $decision{$1} = 1 if $line =~ /^### Decision (\d+): /;
  $principle{$1} = 1 if $line =~ /^### Principle (\d+): /;
}
close $dh;

# Between two words: spaces, or a line break with the next line'"'"'s indentation and comment mark.
my $sep = qr{(?:[ \t]+|[ \t]*\n[ \t]*(?:\*(?!/)|//)?[ \t]*)};
# A list of numbers: 7; 3 and 4; 3 to 5; 1-4; 1, 2 and 3.
my $list = qr{\d+(?:$sep?(?:,|and|or|to|-|\x{e2}\x{80}\x{93})$sep?\d+)*};

# The separator to write between two words: a line break if the old text had one there, else one space.
sub between { my ($old) = @_; return $old =~ /\n/ ? ($old =~ s/^[ \t]+//r) : " "; }

my (@missing, %count);
my $total = 0;
for my $file (@files) {
  open(my $fh, "<:raw", $file) or die "cite-docs: cannot read $file: $!\n";
  my $text = do { local $/; <$fh> };
  close $fh;
  my $n = 0;
  my $want = sub { my ($kind, $have, $num) = @_; push @missing, "$file: $kind $num" unless $have->{$num}; };

  # Sections: docs/decisions.md §N (the section numbers of that page are the old ones).
  $n += $text =~ s{\bDESIGN($sep)sections?($sep)($list)}{
    my ($s1, $s2, $l) = ($1, $2, $3);
    $want->("section", \%section, $_) for $l =~ /(\d+)/g;
    $l =~ s/(\d+)/\x{c2}\x{a7}$1/g;
    "docs/decisions.md" . ($s1 =~ /\n/ ? between($s1) : between($s2)) . $l;
  }ge;

  # Decisions: "decision N", as the code cites them already.
  $n += $text =~ s{([ \t]*)\bDESIGN($sep)(decisions?)($sep)($list)}{
    my ($pre, $s1, $word, $s2, $l) = ($1, $2, $3, $4, $5);
    $want->("decision", \%decision, $_) for $l =~ /(\d+)/g;
    ($s1 =~ /\n/ ? between($s1) : $pre) . $word . between($s2) . $l;
  }ge;

  # Principles: docs/decisions.md, principle N.
  $n += $text =~ s{\bSTYLE($sep)(principles?)($sep)($list)}{
    my ($s1, $word, $s2, $l) = ($1, $2, $3, $4);
    $want->("principle", \%principle, $_) for $l =~ /(\d+)/g;
    "docs/decisions.md," . between($s1) . $word . between($s2) . $l;
  }ge;

  # A bare "(section N)" that goes on from such a citation on the same line means the same page.
  $text =~ s{^(.*docs/decisions\.md \x{c2}\x{a7}.*)$}{
    my $line = $1;
    $n += $line =~ s{\(section (\d+)\)}{$want->("section", \%section, $1); "(\x{c2}\x{a7}$1)"}ge;
    $line;
  }gme;

  next unless $n;
  open(my $out, ">:raw", $file) or die "cite-docs: cannot write $file: $!\n";
  print $out $text;
  close $out or die "cite-docs: cannot write $file: $!\n";
  $count{$file} = $n;
  $total += $n;
}

printf "cite-docs: %s: %d\n", $_, $count{$_} for sort keys %count;
printf "cite-docs: %d citation(s) rewritten in %d file(s)\n", $total, scalar keys %count;

# What is left for a person: any other mention of the old documents.
# test/ops/self-contained.test.ts holds the patterns that find old citations; it names the documents on purpose.
my @left;
for my $file (grep { $_ ne "test/ops/self-contained.test.ts" } @files) {
  open(my $fh, "<:raw", $file) or die "cite-docs: cannot read $file: $!\n";
  while (my $line = <$fh>) {
    push @left, "$file:$.: $line" if $line =~ /\b(?:DESIGN|STYLE)\b|\.\.\/shared\b/;
  }
  close $fh;
}
print "cite-docs: no heading in docs/decisions.md for $_\n" for @missing;
print "cite-docs: still names an outside document: $_" for @left;
exit(@missing || @left ? 1 : 0);
' "$@"
