/**
 * A part of the bridge (docs/README.md, "The bridge's parts"): one feature that the controller (bridge/bridge.ts)
 * starts in its turn and stops in reverse order.
 */

export interface Part {
  /** The part's name in the log (`bridge.start_failed`, `bridge.part_failed`). */
  readonly name: string;
  /** Starts the part; a part whose start fails undoes what it did before it throws. */
  start(): Promise<void>;
  /** Stops the part: after it, the part holds no timer, socket or connection. */
  stop(): Promise<void>;
}

/** A part's start failed: the error names the part, and its message is the cause's. */
export class PartError extends Error {
  override readonly name = 'PartError';
  constructor(
    readonly part: string,
    cause: unknown,
  ) {
    super(cause instanceof Error ? cause.message : String(cause), { cause });
  }
}

/** A part with nothing to start that releases something at stop. */
export function stopOnly(name: string, stop: () => Promise<void>): Part {
  return { name, start: () => Promise.resolve(), stop };
}

/**
 * Work done on an interval while the bridge runs (pruning, sweeping): at start too when `atStart`. The work
 * handles its own errors; the timer does not hold the process open.
 */
export class Periodic implements Part {
  private timer: NodeJS.Timeout | undefined;

  constructor(
    readonly name: string,
    private readonly o: { everyMs: number; atStart: boolean; run: () => void },
  ) {}

  start(): Promise<void> {
    if (this.o.atStart) this.o.run();
    this.timer = setInterval(this.o.run, this.o.everyMs);
    this.timer.unref();
    return Promise.resolve();
  }

  stop(): Promise<void> {
    clearInterval(this.timer);
    this.timer = undefined;
    return Promise.resolve();
  }
}
