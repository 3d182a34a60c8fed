/** The event log (to be built). */
export function Events() {
  return (
    <main>
      <h1>Events</h1>
    </main>
  );
}
